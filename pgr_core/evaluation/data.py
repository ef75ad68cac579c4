"""Evaluation data: one shape for every data set, and the loaders that produce it.

An :class:`EvalSet` is the facts to load into a store plus the questions to ask of it. A question's
gold is either fact ids (exact recall: LoCoMo, PrefEval, MemoryQuest after extraction with ids) or
reference texts only (LLM-judged recall: MemoryQuest references, a user's own data).

Loaders (the data is never shipped with pgr: pass its path):

- :func:`load_locomo_set`: LoCoMo, one fact per turn, turn-level gold evidence.
- :func:`load_prefeval`: PrefEval, each question its own user whose history is the preference, then
  ``fillers`` unrelated conversations, then the question; the gold is the preference turn (explicit)
  or the turns of the preference conversation (implicit: one gold item, found when any of them is).
- :func:`load_jsonl`: the MemoryQuest format, which is also the format for your own data (one user
  per line; see ``docs/eval-format.md``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pgr_core._dates import parse_date
from pgr_core.datasets import json_objects, load_locomo, prefeval_root
from pgr_core.errors import InvalidArgumentError
from pgr_core.types import Fact, Scope

__all__ = ["EvalQuestion", "EvalSet", "load_jsonl", "load_locomo_set", "load_prefeval", "load_set"]


@dataclass
class EvalQuestion:
    id: str
    question: str
    scope: Scope
    date: datetime | None = None
    # gold items: a fact id, or a group of ids (one reference spread over several facts, found when any is)
    gold: list[str | list[str]] = field(default_factory=list)
    missing: int = 0  # gold items that name no fact (count as misses)
    references: list[str] = field(default_factory=list)  # reference texts, for LLM-judged recall
    category: str = ""
    answer: str | None = None  # a reference answer, when the data set has one


@dataclass
class EvalSet:
    name: str
    facts: list[Fact]
    questions: list[EvalQuestion]
    notes: list[str] = field(default_factory=list)  # what the loader had to do to the data

    def select(
        self,
        *,
        limit: int | None = None,
        every: int = 1,
        only_gold: bool = True,
        users: Sequence[str] | None = None,
    ) -> EvalSet:
        """Questions with gold (ids or references), of ``users`` only when given (their ``user_id``),
        every ``every``-th, then the first ``limit``; the facts of the owners those questions ask."""
        if every < 1 or (limit is not None and limit < 1):
            raise InvalidArgumentError("every and limit must be positive integers")
        qs = [q for q in self.questions if not only_gold or q.gold or q.missing or q.references]
        if users:
            wanted = set(users)
            known = {q.scope.user_id for q in qs}
            unknown = sorted(wanted - known)
            if unknown:
                some = ", ".join(sorted(map(str, known))[:10])
                raise InvalidArgumentError(f"no questions for user(s) {', '.join(unknown)}; users here: {some}")
            qs = [q for q in qs if q.scope.user_id in wanted]
        qs = qs[::every]
        if limit is not None:
            qs = qs[:limit]
        scopes = {q.scope for q in qs}
        facts = [f for f in self.facts if f.scope in scopes]
        return EvalSet(self.name, facts, qs, list(self.notes))


# --------------------------------------------------------------------------- LoCoMo


def load_locomo_set(path: str | Path) -> EvalSet:
    data = load_locomo(path)
    questions = [
        EvalQuestion(
            id=q.id,
            question=q.question,
            scope=data.scope_of(q),
            date=q.date,
            gold=list(q.evidence),
            missing=len(q.unresolved),
            category=str(q.category),
        )
        for q in data.questions
    ]
    notes = [f"{data.unresolved_evidence} evidence ids name no turn and count as misses"]
    return EvalSet("locomo", data.facts, questions, notes)


# --------------------------------------------------------------------------- PrefEval


def _turn_text(role: str, content: str, limit: int = 2000) -> str:
    content = " ".join(content.split())
    return f"{role}: {content[:limit]}"


def load_prefeval(
    path: str | Path,
    *,
    kind: Literal["explicit", "choice-based", "persona-driven"] = "explicit",
    fillers: int = 5,
    per_topic: int | None = None,
    seed: int = 0,
    filler_pool: int | None = None,
) -> EvalSet:
    """PrefEval as retrieval: one user per preference (``user_id = "prefeval:<topic>:<i>"``).

    History: session 0 is the preference (explicit: one user turn stating it; implicit: its
    conversation), sessions 1..``fillers`` are filler conversations drawn with ``seed`` from the 24
    unrelated ones, and the question follows. Every turn is one fact. ``per_topic`` keeps the first N
    preferences of each of the 20 topics (the category in the breakdowns). ``filler_pool`` draws the
    fillers from the first N of the 24 conversations instead (each history still holds ``fillers`` of
    them): a cheaper set where writing anything per distinct turn (cues) costs a fraction of the whole.
    """
    root = prefeval_root(path)
    if fillers < 0:
        raise InvalidArgumentError("fillers must be >= 0")
    inter = json.loads((root / "filtered_inter_turns.json").read_text(encoding="utf-8"))
    filler_convs = [c["conversation"] for c in inter]
    if filler_pool is not None:
        if not fillers <= filler_pool <= len(filler_convs):
            raise InvalidArgumentError(
                f"filler_pool must be between fillers ({fillers}) and {len(filler_convs)}"
                " (the filler conversations there are)"
            )
        filler_convs = filler_convs[:filler_pool]
    if fillers > len(filler_convs):
        raise InvalidArgumentError(f"fillers must be at most {len(filler_convs)} (the filler conversations there are)")
    folder = root / ("explicit_preference" if kind == "explicit" else f"implicit_preference/{kind}")
    if not folder.is_dir():
        raise InvalidArgumentError(f"no PrefEval {kind!r} folder at {folder}")
    rng = random.Random(seed)
    facts: list[Fact] = []
    questions: list[EvalQuestion] = []
    for topic_file in sorted(folder.glob("*.json")):
        topic = topic_file.stem
        items = json.loads(topic_file.read_text(encoding="utf-8"))
        if per_topic is not None:
            items = items[:per_topic]
        for i, item in enumerate(items):
            user = f"prefeval:{topic}:{i}"
            scope = Scope(user_id=user)

            def add(session: int, position: int, text: str, *, scope: Scope = scope, user: str = user) -> str:
                fact_id = f"{user}:S{session}:{position}"
                facts.append(
                    Fact(
                        id=fact_id,
                        text=text,
                        scope=scope,
                        type="turn",
                        session_id=f"{user}:S{session}",
                        position=position,
                    )
                )
                return fact_id

            gold: list[str | list[str]] = []
            if kind == "explicit":
                gold.append(add(0, 0, _turn_text("user", item["preference"])))
            else:  # the preference lives somewhere in its conversation: one group, found when any turn is
                gold.append([add(0, position, text) for position, text in enumerate(_implicit_turns(item, kind))])
            for s, conv in enumerate(rng.sample(filler_convs, fillers), start=1):
                for position, turn in enumerate(conv):
                    add(s, position, _turn_text(turn.get("role", "user"), turn.get("content", "")))
            questions.append(
                EvalQuestion(
                    id=user,
                    question=item["question"],
                    scope=scope,
                    gold=gold,
                    references=[item["preference"]],
                    category=topic,
                )
            )
    pool = "" if filler_pool is None else f" drawn from the first {filler_pool}"
    notes = [f"PrefEval {kind}, {fillers} filler conversations per user{pool}, seed {seed}"]
    return EvalSet(f"prefeval-{kind}", facts, questions, notes)


def _implicit_turns(item: Mapping[str, Any], kind: str) -> list[str]:
    conv = item.get("conversation") or {}
    if kind == "choice-based":
        return [
            _turn_text("user", conv.get("query", "")),
            _turn_text("assistant", conv.get("assistant_options", "")),
            _turn_text("user", conv.get("user_selection", "")),
        ]
    turns: list[str] = []
    for key in sorted(conv, key=lambda k: int(k) if str(k).isdigit() else 0):
        pair = conv[key]
        turns += [_turn_text("user", pair.get("user", "")), _turn_text("assistant", pair.get("assistant", ""))]
    return turns


# --------------------------------------------------------------------------- MemoryQuest / your own data


def _require(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise InvalidArgumentError(f"{where}: missing key {key!r}")
    return obj[key]


def user_records(lines: Iterable[str], source: str) -> Iterator[dict[str, Any]]:
    """The objects of a JSON Lines file (:func:`pgr_core.datasets.json_objects` without line numbers)."""
    return (record for _, record in json_objects(lines, source))


def load_jsonl(path: str | Path, *, name: str = "memoryquest") -> EvalSet:
    """One user per line (the MemoryQuest format; ``docs/eval-format.md`` describes every key).

    Facts come from ``facts`` when the line has them, else every turn of ``sessions`` becomes one
    (``"<speaker>: <text>"``). A query's ``references`` are texts, each optionally with ``fact_ids``;
    references with ids are scored exactly, the others by an LLM judge.
    """
    path = Path(path)
    if not path.exists():
        raise InvalidArgumentError(f"no file at {path}")
    facts: list[Fact] = []
    questions: list[EvalQuestion] = []
    with path.open(encoding="utf-8") as fh:
        for n, record in json_objects(fh, str(path)):
            where = f"{path} line {n}"
            user = str(_require(record, "user_id", where))
            scope = Scope(user_id=user)
            known: set[str] = set()
            if record.get("facts"):
                for i, f in enumerate(record["facts"]):
                    fid = str(f.get("id") or f"{user}:f{i}")
                    facts.append(
                        Fact(
                            id=fid,
                            text=str(_require(f, "text", f"{where} fact {i}")),
                            scope=scope,
                            type=f.get("type"),
                            date=parse_date(f["date"]) if f.get("date") else None,
                            session_id=f.get("session_id"),
                            position=f.get("position"),
                        )
                    )
                    known.add(fid)
            else:
                for s in record.get("sessions", []):
                    sid = str(_require(s, "id", f"{where} session"))
                    when = parse_date(s["date"]) if s.get("date") else None
                    for position, turn in enumerate(s.get("turns", [])):
                        fid = f"{user}:{sid}:{position}"
                        speaker = turn.get("speaker") or turn.get("role") or "user"
                        facts.append(
                            Fact(
                                id=fid,
                                text=f"{speaker}: {_require(turn, 'text', where)}",
                                scope=scope,
                                type="turn",
                                date=when,
                                session_id=f"{user}:{sid}",
                                position=position,
                            )
                        )
                        known.add(fid)
            for j, q in enumerate(record.get("queries", [])):
                refs = q.get("references", [])
                # one gold item per reference with ids: found when any of its facts is
                groups = [[str(i) for i in r["fact_ids"]] for r in refs if isinstance(r, Mapping) and r.get("fact_ids")]
                resolved = [[i for i in g if i in known] for g in groups]
                texts = [r["text"] if isinstance(r, Mapping) else str(r) for r in refs]
                questions.append(
                    EvalQuestion(
                        id=str(q.get("id") or f"{user}:q{j}"),
                        question=str(_require(q, "query", f"{where} query {j}")),
                        scope=scope,
                        date=parse_date(q["date"]) if q.get("date") else None,
                        gold=[g[0] if len(g) == 1 else g for g in resolved if g],
                        missing=sum(1 for g in resolved if not g),
                        references=texts,
                        category=str(q.get("category", "")),
                        answer=q.get("answer"),
                    )
                )
    return EvalSet(name, facts, questions)


def load_set(name: str, path: str | Path, **options: Any) -> EvalSet:
    """``locomo``, ``prefeval`` (options: kind, fillers, per_topic, seed, filler_pool), ``memoryquest`` or ``jsonl``."""
    if name == "locomo":
        return load_locomo_set(path)
    if name == "prefeval":
        return load_prefeval(path, **options)
    if name in ("memoryquest", "jsonl"):
        return load_jsonl(path, name=name)
    raise InvalidArgumentError(f"unknown data set {name!r}: use locomo, prefeval, memoryquest or jsonl")
