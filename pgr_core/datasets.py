"""Benchmark data readers (the data itself is never shipped: pass its path).

The one place each data set's files are read; the evaluation (:mod:`pgr_core.evaluation.data`) and the
write side (:mod:`pgr_core.write.sessions`, :mod:`pgr_core.write.examples`) build on these.

- LoCoMo (snap-research, CC BY-NC 4.0): ten long two-person conversations with turn-level gold
  evidence. :func:`read_locomo` parses the file into conversations of dated sessions;
  :func:`load_locomo` turns each turn into one dated fact owned by ``Scope(user_id=<sample id>)``,
  with its session and position so the temporal window works.
- PrefEval: :func:`prefeval_root` finds its folder.
- JSON Lines (``docs/eval-format.md`` and friends): :func:`json_objects` reads one object per line.

A LoCoMo session's date is its ``session_N_date_time`` (``"1:56 pm on 8 May, 2023"``). A session
without one is undated (``None``): no date is borrowed from a neighbour, since a borrowed date would
put its facts in the wrong temporal window and resolve its "yesterday" against the wrong day. A date
that is there but unreadable is an error naming the session, not a silent ``None``. Date times that
name no session (conv-26 lists sixteen past its last one) are ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pgr_core._dates import parse_date
from pgr_core.errors import InvalidArgumentError
from pgr_core.types import Fact, Scope

__all__ = [
    "Locomo",
    "LocomoConversation",
    "LocomoQuestion",
    "LocomoSession",
    "LocomoTurn",
    "json_objects",
    "load_locomo",
    "prefeval_root",
    "read_locomo",
]

_SESSION = re.compile(r"^session_(\d+)$")
_EVIDENCE = re.compile(r"D(\d+):(\d+)")
_LOCOMO_DATE_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y")


# --------------------------------------------------------------------------- LoCoMo: the file


@dataclass(frozen=True)
class LocomoTurn:
    """One turn. ``text`` carries a shared image's caption (``... [shares a photo of a dog]``)."""

    id: str  # LoCoMo's dia_id, "D1:3"
    speaker: str
    text: str

    @property
    def line(self) -> str:
        return f"{self.speaker}: {self.text}"


@dataclass(frozen=True)
class LocomoSession:
    number: int  # N of session_N
    date: datetime | None  # None when the session has no date time (see the module's docstring)
    turns: tuple[LocomoTurn, ...]


@dataclass(frozen=True)
class LocomoConversation:
    sample_id: str
    sessions: tuple[LocomoSession, ...]  # in session order
    qa: tuple[Mapping[str, Any], ...]

    @property
    def last_date(self) -> datetime | None:
        """The date of the last dated session: the conversation's questions come after it."""
        return next((s.date for s in reversed(self.sessions) if s.date is not None), None)


def _locomo_date(text: Any, where: str) -> datetime | None:
    if text is None or (isinstance(text, str) and not text.strip()):
        return None  # no date time: the session is undated
    if isinstance(text, str):
        for fmt in _LOCOMO_DATE_FORMATS:
            try:
                return datetime.strptime(text.strip(), fmt)
            except ValueError:
                continue
        try:
            return parse_date(text)  # an ISO date, for hand-made files
        except InvalidArgumentError:
            pass
    raise InvalidArgumentError(
        f"{where}: date time {text!r} is not a LoCoMo date; write it as '1:56 pm on 8 May, 2023' or an "
        "ISO date ('2023-05-08T13:56'), or leave it out to keep the session undated"
    )


def _locomo_turn(raw: Any, where: str) -> LocomoTurn:
    if not isinstance(raw, Mapping) or not all(isinstance(raw.get(k), str) for k in ("dia_id", "speaker", "text")):
        raise InvalidArgumentError(f"{where}: a LoCoMo turn needs the strings dia_id, speaker and text")
    caption = raw.get("blip_caption")
    text = raw["text"] + (f" [shares {caption}]" if caption else "")
    return LocomoTurn(raw["dia_id"], raw["speaker"], text)


def _locomo_conversation(raw: Mapping[str, Any]) -> LocomoConversation:
    sample = str(raw["sample_id"])
    conv = raw["conversation"]
    numbers = sorted(int(m.group(1)) for m in map(_SESSION.match, conv) if m)
    sessions = []
    for number in numbers:
        where = f"LoCoMo {sample} session_{number}"
        turns = conv[f"session_{number}"]
        if not isinstance(turns, list):
            raise InvalidArgumentError(f"{where}: expected a list of turns")
        sessions.append(
            LocomoSession(
                number=number,
                date=_locomo_date(conv.get(f"session_{number}_date_time"), where),
                turns=tuple(_locomo_turn(t, f"{where} turn {i}") for i, t in enumerate(turns)),
            )
        )
    return LocomoConversation(sample, tuple(sessions), tuple(raw.get("qa") or ()))


def read_locomo(path: str | Path) -> list[LocomoConversation]:
    """LoCoMo's conversations (``path`` is ``locomo10.json`` or the folder holding it).

    >>> [c.sample_id for c in read_locomo("../shared/data/locomo")][:2]  # doctest: +SKIP
    ['conv-26', 'conv-30']
    """
    path = Path(path)
    if path.is_dir():
        path = path / "locomo10.json"
    if not path.exists():
        raise InvalidArgumentError(f"no LoCoMo file at {path} (expected locomo10.json)")
    hint = " (a JSON Lines file? evaluate it with `pgr eval jsonl`)" if path.suffix == ".jsonl" else ""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"{path} is not a LoCoMo JSON file{hint}: {exc}") from None
    shape = isinstance(data, list) and all(
        isinstance(c, dict) and "sample_id" in c and isinstance(c.get("conversation"), dict) for c in data
    )
    if not shape:
        raise InvalidArgumentError(
            f"{path} is not a LoCoMo JSON file{hint}: LoCoMo is one list of conversations, each with "
            "sample_id and conversation"
        )
    return [_locomo_conversation(c) for c in data]


# --------------------------------------------------------------------------- LoCoMo: facts and questions


@dataclass
class LocomoQuestion:
    id: str
    conversation: str
    question: str
    category: int
    date: datetime | None  # the date of the conversation's last dated session: questions come after it
    evidence: list[str]  # resolved fact ids
    unresolved: list[str] = field(default_factory=list)  # evidence strings naming no turn


@dataclass
class Locomo:
    facts: list[Fact]
    questions: list[LocomoQuestion]
    unresolved_evidence: int

    def scope_of(self, q: LocomoQuestion) -> Scope:
        return Scope(user_id=q.conversation)


def _normalise_evidence(raw: str) -> Iterator[tuple[int, int] | str]:
    """``'D8:6; D9:17'``, ``'D30:05'``, space-joined lists: yield (session, turn) or the bad piece."""
    pieces = [p for p in re.split(r"[;\s,]+", raw) if p]
    for piece in pieces:
        m = _EVIDENCE.fullmatch(piece)
        yield (int(m.group(1)), int(m.group(2))) if m else piece


def load_locomo(path: str | Path) -> Locomo:
    """Every turn of :func:`read_locomo` as one fact (id ``<sample>:<dia_id>``), and the questions with
    their evidence resolved to those ids."""
    facts: list[Fact] = []
    questions: list[LocomoQuestion] = []
    unresolved_total = 0
    for conv in read_locomo(path):
        sample = conv.sample_id
        scope = Scope(user_id=sample)
        ids: dict[tuple[int, int], str] = {}
        for session in conv.sessions:
            for position, turn in enumerate(session.turns):
                fact_id = f"{sample}:{turn.id}"
                m = _EVIDENCE.fullmatch(turn.id)
                if m:
                    ids[(int(m.group(1)), int(m.group(2)))] = fact_id
                facts.append(
                    Fact(
                        id=fact_id,
                        text=turn.line,
                        scope=scope,
                        type="turn",
                        date=session.date,
                        session_id=f"{sample}:S{session.number}",
                        position=position,
                        metadata={"speaker": turn.speaker},
                    )
                )
        for i, qa in enumerate(conv.qa):
            resolved, bad = [], []
            for raw in qa.get("evidence", []):
                for item in _normalise_evidence(raw):
                    if isinstance(item, tuple) and item in ids:
                        resolved.append(ids[item])
                    else:
                        bad.append(raw if isinstance(item, tuple) else item)
            unresolved_total += len(bad)
            questions.append(
                LocomoQuestion(
                    id=f"{sample}:q{i}",
                    conversation=sample,
                    question=qa["question"],
                    category=int(qa["category"]),
                    date=conv.last_date,
                    evidence=list(dict.fromkeys(resolved)),
                    unresolved=bad,
                )
            )
    return Locomo(facts=facts, questions=questions, unresolved_evidence=unresolved_total)


# --------------------------------------------------------------------------- PrefEval


def prefeval_root(path: str | Path) -> Path:
    """The PrefEval folder: ``path`` itself or its ``benchmark_dataset/``, whichever holds
    ``explicit_preference/``."""
    path = Path(path)
    for candidate in (path, path / "benchmark_dataset"):
        if (candidate / "explicit_preference").is_dir():
            return candidate
    raise InvalidArgumentError(
        f"no PrefEval data at {path}: expected a folder holding explicit_preference/, "
        "filtered_inter_turns.json and (for multiple choice) mcq_options/ (see ../shared/data/README.md)"
    )


# --------------------------------------------------------------------------- JSON Lines


def json_objects(lines: Iterable[str], source: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each JSON object of ``lines`` with its line number (1-based; blank lines are skipped but
    counted). A line that is not one JSON object raises :class:`InvalidArgumentError` naming
    ``source`` and the line.

    >>> list(json_objects(['{"user_id": "u1"}', "", '{"user_id": "u2"}'], "d.jsonl"))
    [(1, {'user_id': 'u1'}), (3, {'user_id': 'u2'})]
    """
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"{source} line {n}: not JSON ({exc.msg})") from None
        except RecursionError:
            raise InvalidArgumentError(f"{source} line {n}: nested too deep to read; flatten it") from None
        if not isinstance(record, dict):
            raise InvalidArgumentError(f"{source} line {n}: expected one JSON object per line")
        yield n, record
