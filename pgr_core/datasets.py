"""Benchmark data loaders (the data itself is never shipped: pass its path).

LoCoMo (snap-research, CC BY-NC 4.0): ten long two-person conversations with turn-level gold evidence.
Each turn becomes one dated fact owned by ``Scope(user_id=<sample id>)``, with its session and
position so the temporal window works.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .errors import InvalidArgumentError
from .types import Fact, Scope

__all__ = ["LocomoQuestion", "load_locomo"]

_SESSION = re.compile(r"^session_(\d+)$")
_EVIDENCE = re.compile(r"D(\d+):(\d+)")


@dataclass
class LocomoQuestion:
    id: str
    conversation: str
    question: str
    category: int
    date: datetime | None  # the date of the conversation's last session: questions come after it
    evidence: list[str]  # resolved fact ids
    unresolved: list[str] = field(default_factory=list)  # evidence strings naming no turn


@dataclass
class Locomo:
    facts: list[Fact]
    questions: list[LocomoQuestion]
    unresolved_evidence: int

    def scope_of(self, q: LocomoQuestion) -> Scope:
        return Scope(user_id=q.conversation)


def _parse_when(text: str) -> datetime | None:
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y"):
        try:
            return datetime.strptime(text.strip(), fmt)
        except ValueError:
            continue
    return None


def _normalise_evidence(raw: str) -> Iterator[tuple[int, int] | str]:
    """``'D8:6; D9:17'``, ``'D30:05'``, space-joined lists: yield (session, turn) or the bad piece."""
    pieces = [p for p in re.split(r"[;\s,]+", raw) if p]
    for piece in pieces:
        m = _EVIDENCE.fullmatch(piece)
        yield (int(m.group(1)), int(m.group(2))) if m else piece


def load_locomo(path: str | Path) -> Locomo:
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
    if not isinstance(data, list) or not all(isinstance(c, dict) and "conversation" in c for c in data):
        raise InvalidArgumentError(
            f"{path} is not a LoCoMo JSON file{hint}: LoCoMo is one list of conversations, each with "
            "sample_id and conversation"
        )
    facts: list[Fact] = []
    questions: list[LocomoQuestion] = []
    unresolved_total = 0
    for conv in data:
        sample = conv["sample_id"]
        scope = Scope(user_id=sample)
        sessions = conv["conversation"]
        ids: dict[tuple[int, int], str] = {}
        last_date: datetime | None = None
        for key in sorted((k for k in sessions if _SESSION.match(k)), key=lambda k: int(k.split("_")[1])):
            number = int(key.split("_")[1])
            when = _parse_when(sessions.get(f"{key}_date_time", ""))
            last_date = when or last_date
            for position, turn in enumerate(sessions[key]):
                text = f"{turn['speaker']}: {turn['text']}"
                if turn.get("blip_caption"):
                    text += f" [shares {turn['blip_caption']}]"
                fact_id = f"{sample}:{turn['dia_id']}"
                m = _EVIDENCE.fullmatch(turn["dia_id"])
                if m:
                    ids[(int(m.group(1)), int(m.group(2)))] = fact_id
                facts.append(
                    Fact(
                        id=fact_id,
                        text=text,
                        scope=scope,
                        type="turn",
                        date=when,
                        session_id=f"{sample}:S{number}",
                        position=position,
                        metadata={"speaker": turn["speaker"]},
                    )
                )
        for i, qa in enumerate(conv["qa"]):
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
                    date=last_date,
                    evidence=list(dict.fromkeys(resolved)),
                    unresolved=bad,
                )
            )
    return Locomo(facts=facts, questions=questions, unresolved_evidence=unresolved_total)
