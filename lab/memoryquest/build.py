"""MemoryQuest construction: from persona profiles to a data set of hard, dated memory questions.

Research code, outside pgr's wheel (it builds the evaluation data; users of pgr do not run it):

    python lab/memoryquest/build.py --personas lab/memoryquest/personas.jsonl --out mq.jsonl --work DIR \
        [--cache DIR] [--base-url URL --model M] [--max-queries 15] [--max-cosine 0.3] [--seed 0]

The paper's recipe, one function per step, in the order it runs:

1. :meth:`_Build.queries_stage`: the LLM invents under-specified requests for each persona, each with 3-5
   *required references* (facts about the user a tailored answer needs). A request is kept only when
   the mean cosine between it and its references is at most ``max_cosine`` (0.3): the references must
   be far from it in embedding space, or query-only retrieval would find them. At most
   ``max_queries_per_user`` (15) per user; each kept request gets a date drawn with ``seed``.
2. :meth:`_Build.timelines_stage`: per request, a dated timeline of 5-10 events before its date, every
   reference placed in exactly one event (checked; one retry with the problem stated, then the
   request is dropped and the reason recorded).
3. :meth:`_Build.dialogues_stage`: per event, a user/assistant conversation of 5-30 turns in which the
   event's references come up, each turn tagged with the references it reveals (fewer than 5 turns:
   one retry, then dropped; more than 30: clipped).
4. :meth:`_Build.facts_stage`: fact extraction, a pluggable ``extract(sessions, user_id) -> [fact dict]``.
   The default, :func:`raw_facts`, makes every turn one fact (id ``<user>:<session>:<position>``).
5. :meth:`_Build.assemble`: one JSON line per user in the format of ``docs/eval-format.md``
   (loaded by :func:`pgr_core.evaluation.load_jsonl`).

Gold fact ids. A reference's ``fact_ids`` are facts of the session (event dialogue) it was placed
in: those at the positions of the turns the dialogue tagged with it; when no turn was tagged (or the
facts carry no position, as LLM-extracted facts may not), the session's user turns (facts with
``speaker == "user"``), else every fact of that session. A request is written only when each of its
references resolves to at least one fact.

Resuming. ``work_dir`` holds one checkpoint file per stage and user (``queries/``, ``timelines/``,
``dialogues/``, ``facts/``), rewritten atomically after every item, each entry keyed by a
fingerprint of its inputs: a rerun skips what is done and redoes only what its inputs changed, and a
killed run continues where it stopped. Outcomes are checkpointed (a dropped request stays dropped);
LLM failures (:class:`~pgr_core.errors.LLMError`) are not: the item is skipped and recorded, and the
next run asks again. After five LLM failures in a row the run stops asking and writes what it has.
With ``cache_dir`` every reply is also cached (:class:`~pgr_core.evaluation.cache.CachedLLM`).
Counts (kept, dropped and why, pending) go to ``work_dir/summary.json`` and stderr.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from pgr_core.errors import InvalidArgumentError, LLMError, LLMOutputError
from pgr_core.evaluation.cache import CachedLLM
from pgr_core.evaluation.data import user_records
from pgr_core.models.llm import LLM, parse_json
from pgr_core.models.prompts import render as _render
from pgr_core.types import Embedder

__all__ = [
    "BuildSummary",
    "Extractor",
    "Persona",
    "build_memoryquest",
    "example_personas",
    "load_personas",
    "raw_facts",
]

# The paper's bounds.
REFERENCES = (3, 5)
EVENTS = (5, 10)
TURNS = (5, 30)
PER_CALL = 5  # requests asked for per LLM call: short replies survive small models' token limits
TEMPERATURE = 0.7  # generation wants variety; the cache and checkpoints make reruns repeatable
FIRST_QUERY_DAY = date(2025, 1, 1)
QUERY_DAYS = 365  # query dates are drawn from the year starting FIRST_QUERY_DAY
MAX_FAILURES_IN_A_ROW = 5

Extractor = Callable[[Sequence[Mapping[str, Any]], str], list[dict[str, Any]]]
"""``extract(sessions, user_id) -> facts``: sessions as written to the output (``id``, ``date``,
``turns`` of ``{speaker, text}``); each fact a dict with ``text`` and, for gold ids, ``id`` and
``session_id`` (``"<user>:<session id>"``, or a ``sessions`` list of them) and ``position`` if a turn."""


# --------------------------------------------------------------------------- personas


@dataclass(frozen=True)
class Persona:
    user_id: str
    persona: str


def load_personas(path: str | Path) -> list[Persona]:
    """Persona profiles, one JSON object per line: ``{"user_id": ..., "persona": "..."}``."""
    path = Path(path)
    if not path.is_file():
        raise InvalidArgumentError(f"no personas file at {path}: pass a JSONL file of {{user_id, persona}} lines")
    personas: list[Persona] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as fh:
        for n, record in enumerate(user_records(fh, str(path)), 1):
            user = str(record.get("user_id") or "").strip()
            text = record.get("persona")
            if not user:
                raise InvalidArgumentError(f"{path} record {n}: missing user_id")
            if not isinstance(text, str) or not text.strip():
                raise InvalidArgumentError(f"{path} record {n} ({user}): persona must be a non-empty string")
            if user in seen:
                raise InvalidArgumentError(f"{path} record {n}: user_id {user!r} appears twice; make it unique")
            seen.add(user)
            personas.append(Persona(user, " ".join(text.split())))
    if not personas:
        raise InvalidArgumentError(f"{path} holds no personas")
    return personas


def example_personas() -> Path:
    """The three example personas beside this script (``lab/memoryquest/personas.jsonl``)."""
    return HERE / "personas.jsonl"


HERE = Path(__file__).resolve().parent


def render(name: str, **fields: Any) -> str:
    """A prompt filled with ``str.format``: this builder's own (``prompts/<name>.md`` beside it), else pgr's."""
    own = HERE / "prompts" / f"{name}.md"
    if own.is_file():
        return own.read_text(encoding="utf-8").format(**fields)
    return _render(name, **fields)


# --------------------------------------------------------------------------- fact extraction (raw mode)


def raw_facts(sessions: Sequence[Mapping[str, Any]], user_id: str) -> list[dict[str, Any]]:
    """Raw mode: every turn is one fact ``"<speaker>: <text>"``, id ``<user>:<session>:<position>``."""
    facts: list[dict[str, Any]] = []
    for s in sessions:
        for position, turn in enumerate(s["turns"]):
            facts.append(
                {
                    "id": f"{user_id}:{s['id']}:{position}",
                    "text": f"{turn['speaker']}: {turn['text']}",
                    "type": "turn",
                    "date": s["date"],
                    "session_id": f"{user_id}:{s['id']}",
                    "position": position,
                    "speaker": turn["speaker"],
                }
            )
    return facts


# --------------------------------------------------------------------------- reply schemas

QUERIES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["queries"],
    "properties": {
        "queries": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["query", "references"],
                "properties": {
                    "query": {"type": "string"},
                    "category": {"type": "string"},
                    "references": {"type": "array", "items": {"type": "string"}},
                },
            },
        }
    },
}

TIMELINE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["events"],
    "properties": {
        "events": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["date", "event", "references"],
                "properties": {
                    "date": {"type": "string"},
                    "event": {"type": "string"},
                    "references": {"type": "array", "items": {"type": "integer"}},
                },
            },
        }
    },
}

DIALOGUE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["turns"],
    "properties": {
        "turns": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["speaker", "text"],
                "properties": {
                    "speaker": {"type": "string", "enum": ["user", "assistant"]},
                    "text": {"type": "string"},
                    "references": {"type": "array", "items": {"type": "integer"}},
                },
            },
        }
    },
}


def _loose(schema: dict[str, Any], key: str) -> dict[str, Any]:
    """The schema without item types for lists of reference numbers: "2" is read as 2 by the checks."""
    items = dict(schema["properties"][key]["items"])
    items["properties"] = {k: v for k, v in items["properties"].items() if k != "references"}
    return {**schema, "properties": {key: {"type": "array", "items": items}}}


TIMELINE_CHECK = _loose(TIMELINE_SCHEMA, "events")
DIALOGUE_CHECK = _loose(DIALOGUE_SCHEMA, "turns")


# --------------------------------------------------------------------------- small helpers


class _Invalid(ValueError):
    """A reply that parsed but breaks the construction's rules; the message goes back to the LLM."""


def _fingerprint(*parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _file_name(user_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", user_id)[:60]
    return safe if safe == user_id else f"{safe}-{hashlib.sha1(user_id.encode()).hexdigest()[:8]}"


def _squash(value: Any) -> str:
    return " ".join(str(value).split()) if value is not None else ""


def _numbers(value: Any) -> list[int]:
    """Reference numbers from a reply: ints, or strings of digits; anything else raises _Invalid."""
    out: list[int] = []
    for item in value or []:
        if isinstance(item, bool) or not isinstance(item, int | str) or not str(item).strip().isdigit():
            raise _Invalid(f"reference numbers must be integers, got {item!r}")
        out.append(int(item))
    return out


def _numbered(texts: Sequence[str]) -> str:
    return "\n".join(f"{i}. {t}" for i, t in enumerate(texts, 1))


def _query_date(seed: int, user_id: str, k: int) -> str:
    rng = random.Random(f"{seed}:{user_id}:{k}")
    return (FIRST_QUERY_DAY + timedelta(days=rng.randrange(QUERY_DAYS))).isoformat()


class _Checkpoint:
    """One stage's results for one user: a JSON object of entries, rewritten atomically after each."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}  # absent or torn: redo
        self.data: dict[str, Any] = data if isinstance(data, dict) else {}

    def get(self, key: str, fp: str) -> dict[str, Any] | None:
        entry = self.data.get(key)
        return entry if isinstance(entry, dict) and entry.get("fp") == fp else None

    def put(self, key: str, fp: str, entry: Mapping[str, Any]) -> dict[str, Any]:
        self.data[key] = {**entry, "fp": fp}
        _write_atomic(self.path, json.dumps(self.data, ensure_ascii=False))
        return self.data[key]


# --------------------------------------------------------------------------- reply checks


def _check_candidates(value: Any, final: bool) -> list[Mapping[str, Any]]:
    queries = [q for q in value["queries"] if isinstance(q, Mapping)]
    if not queries:
        raise _Invalid("the reply holds no queries")
    return queries


def _check_timeline(value: Any, final: bool, *, n_refs: int, before: date) -> list[dict[str, Any]]:
    events = value["events"]
    if not EVENTS[0] <= len(events) <= EVENTS[1]:
        raise _Invalid(f"the timeline has {len(events)} events; write between {EVENTS[0]} and {EVENTS[1]}")
    out = []
    for i, e in enumerate(events, 1):
        raw = _squash(e.get("date"))
        try:
            when = date.fromisoformat(raw[:10])
        except ValueError:
            raise _Invalid(f"event {i} has date {raw!r}; write dates as YYYY-MM-DD") from None
        if when >= before:
            raise _Invalid(f"event {i} is dated {when}, not before {before}; every event must come earlier")
        text = _squash(e.get("event"))
        if not text:
            raise _Invalid(f"event {i} has no text")
        refs = sorted(set(_numbers(e.get("references"))))
        wrong = [r for r in refs if not 1 <= r <= n_refs]
        if wrong:
            raise _Invalid(f"event {i} names reference {wrong[0]}, but the references are numbered 1 to {n_refs}")
        out.append({"date": when.isoformat(), "event": text, "references": [r - 1 for r in refs]})
    for r in range(n_refs):
        count = sum(r in e["references"] for e in out)
        if count != 1:
            where = "no event" if count == 0 else f"{count} events"
            raise _Invalid(f"reference {r + 1} is placed in {where}; place each reference in exactly one event")
    return sorted(out, key=lambda e: e["date"])  # stable: same-day events keep the model's order


def _check_dialogue(value: Any, final: bool, *, n_refs: int) -> dict[str, Any]:
    turns: list[dict[str, Any]] = []
    tags: dict[int, list[int]] = {}
    for t in value["turns"]:
        text = _squash(t.get("text"))
        if not text:
            continue
        speaker = _squash(t.get("speaker") or t.get("role")).lower()
        speaker = "assistant" if speaker.startswith("assist") or speaker == "ai" else "user"
        refs = [r for r in _numbers(t.get("references")) if 1 <= r <= n_refs]
        if len(turns) < TURNS[1]:  # beyond the bound the turn is clipped, its tags with it
            for r in sorted(set(refs)):
                tags.setdefault(r - 1, []).append(len(turns))
        turns.append({"speaker": speaker, "text": text})
    if len(turns) < TURNS[0]:
        raise _Invalid(f"the conversation has {len(turns)} turns; write between {TURNS[0]} and {TURNS[1]}")
    untagged = [r + 1 for r in range(n_refs) if r not in tags]
    if untagged and not final:
        raise _Invalid(
            f"no turn is marked with fact {untagged[0]}; bring every fact up and mark the turns that reveal it"
        )
    clipped = max(0, len(turns) - TURNS[1])
    return {"turns": turns[: TURNS[1]], "tags": tags, "clipped": clipped, "untagged": [r - 1 for r in untagged]}


def _ask(
    llm: LLM,
    prompt: str,
    schema: Mapping[str, Any],
    check: Mapping[str, Any],
    max_tokens: int,
    validate: Callable[[Any, bool], Any],
) -> tuple[Any, str]:
    """One schema-bound request, retried once with the problem stated: (value, "") or (None, problem).

    LLM failures (timeouts, refused connections) propagate as :class:`LLMError`.
    """
    messages: list[dict[str, str]] = [{"role": "user", "content": prompt}]
    problem = ""
    for final in (False, True):
        completion = llm.complete(messages, schema=schema, max_tokens=max_tokens, temperature=TEMPERATURE)
        try:
            return validate(parse_json(completion.text, check), final), ""
        except LLMOutputError as exc:
            problem = str(exc) + (" (cut off at the length limit: write less)" if completion.truncated else "")
        except _Invalid as exc:
            problem = str(exc)
        messages = [
            messages[0],
            {"role": "assistant", "content": completion.text[:4000]},
            {"role": "user", "content": render("repair", problem=problem)},
        ]
    return None, problem


# --------------------------------------------------------------------------- the summary


@dataclass
class BuildSummary:
    """What a build made and lost. ``dropped``: requests lost to a rule, by reason (a rerun keeps them
    dropped); ``pending``: work an LLM failure left undone (a rerun asks again)."""

    users: int = 0
    users_written: int = 0
    candidates: int = 0
    kept: int = 0  # requests that passed the reference and cosine filters
    written: int = 0  # requests in the output
    dropped: Counter[str] = field(default_factory=Counter)
    pending: Counter[str] = field(default_factory=Counter)
    sessions: int = 0
    turns: int = 0
    facts: int = 0
    dialogues_dropped: int = 0  # events whose dialogue broke the turn bounds twice
    clipped_dialogues: int = 0
    references_by_fallback: int = 0  # gold taken from the session's user turns (no turn was tagged)
    errors: list[str] = field(default_factory=list)  # LLM failures
    notes: list[str] = field(default_factory=list)  # why things were dropped (the first 100)

    def to_dict(self) -> dict[str, Any]:
        return {
            "users": self.users,
            "users_written": self.users_written,
            "candidates": self.candidates,
            "kept": self.kept,
            "written": self.written,
            "dropped": dict(sorted(self.dropped.items())),
            "pending": dict(sorted(self.pending.items())),
            "sessions": self.sessions,
            "turns": self.turns,
            "facts": self.facts,
            "dialogues_dropped": self.dialogues_dropped,
            "clipped_dialogues": self.clipped_dialogues,
            "references_by_fallback": self.references_by_fallback,
            "errors": self.errors,
            "notes": self.notes,
        }

    def line(self) -> str:
        dropped = ", ".join(f"{k} {v}" for k, v in sorted(self.dropped.items())) or "none"
        pending = ", ".join(f"{k} {v}" for k, v in sorted(self.pending.items())) or "none"
        return (
            f"memoryquest: {self.written} requests for {self.users_written}/{self.users} users "
            f"({self.candidates} candidates, {self.kept} passed the filters; dropped: {dropped}; "
            f"pending after LLM failures: {pending}); {self.sessions} sessions, {self.turns} turns, "
            f"{self.facts} facts"
        )


# --------------------------------------------------------------------------- the build


class _Build:
    def __init__(
        self,
        personas: list[Persona],
        *,
        llm: LLM,
        embedder: Embedder,
        work_dir: Path,
        max_queries: int,
        max_cosine: float,
        extract: Extractor,
        seed: int,
        log: Callable[[str], None],
    ) -> None:
        self.personas = personas
        self.llm = llm
        self.embedder = embedder
        self.work = work_dir
        self.max_queries = max_queries
        self.max_cosine = max_cosine
        self.extract = extract
        self.extract_name = str(getattr(extract, "name", None) or getattr(extract, "__qualname__", repr(extract)))
        self.seed = seed
        self.log = log
        self.summary = BuildSummary(users=len(personas))
        self.failures_in_a_row = 0
        self.halted = False
        self._checkpoints: dict[tuple[str, str], _Checkpoint] = {}
        self.queries: dict[str, list[dict[str, Any]]] = {}
        self.timelines: dict[str, dict[str, Any]] = {}  # query id -> entry
        self.dialogues: dict[str, dict[str, Any]] = {}  # "<query id>#e<j>" -> entry
        self.sessions: dict[str, list[dict[str, Any]]] = {}
        self.facts: dict[str, list[dict[str, Any]]] = {}

    # -- plumbing
    def checkpoint(self, stage: str, user_id: str) -> _Checkpoint:
        key = (stage, user_id)
        if key not in self._checkpoints:
            self._checkpoints[key] = _Checkpoint(self.work / stage / f"{_file_name(user_id)}.json")
        return self._checkpoints[key]

    def progress(self, stage: str, done: int, total: int, unit: str) -> None:
        if done == total or done % max(1, total // 20) == 0:  # about twenty lines a stage
            self.log(f"  memoryquest {stage}: {done}/{total} {unit}")

    def call(self, stage: str, item: str, prompt: str, *args: Any) -> tuple[Any, str] | None:
        """:func:`_ask`, or None when the LLM failed (recorded; the item waits for the next run)."""
        if self.halted:
            self.summary.pending[stage] += 1
            return None
        try:
            result = _ask(self.llm, prompt, *args)
        except LLMError as exc:
            self.summary.pending[stage] += 1
            self.summary.errors.append(f"{stage} {item}: {type(exc).__name__}: {exc}")
            self.log(f"  memoryquest {stage} {item}: LLM failed ({exc}); skipped, a rerun asks again")
            self.failures_in_a_row += 1
            if self.failures_in_a_row >= MAX_FAILURES_IN_A_ROW:
                self.halted = True
                self.summary.errors.append(f"stopped asking after {MAX_FAILURES_IN_A_ROW} LLM failures in a row")
                self.log(f"  memoryquest: {MAX_FAILURES_IN_A_ROW} LLM failures in a row; writing what is done")
            return None
        self.failures_in_a_row = 0
        return result

    def note(self, text: str) -> None:
        if len(self.summary.notes) < 100:
            self.summary.notes.append(text)

    def mean_cosine(self, query: str, references: Sequence[str]) -> float:
        rows = self.embedder.embed([query, *references])
        return float(np.mean(rows[1:] @ rows[0]))

    # -- 1. queries with required references, far from the query
    def queries_stage(self) -> None:
        total = len(self.personas)
        for i, p in enumerate(self.personas, 1):
            self.queries[p.user_id] = self.queries_for(p)
            self.progress("queries", i, total, "users")

    def queries_for(self, p: Persona) -> list[dict[str, Any]]:
        ckpt = self.checkpoint("queries", p.user_id)
        fp = _fingerprint(p.persona, self.max_queries, self.max_cosine, self.embedder.name, self.seed, PER_CALL)
        state = ckpt.get("state", fp) or {"rounds": 0, "kept": [], "dropped": [], "complete": False}
        rounds = math.ceil(2 * self.max_queries / PER_CALL)  # room for drops, bounded
        while not state["complete"]:
            if len(state["kept"]) >= self.max_queries or state["rounds"] >= rounds:
                state["complete"] = True
                state = ckpt.put("state", fp, state)
                break
            written = [q["query"] for q in state["kept"]] + [d["query"] for d in state["dropped"] if d["query"]]
            prompt = render(
                "mq_queries",
                persona=p.persona,
                n=PER_CALL,
                written="\n".join(f"- {w}" for w in written) or "(none yet)",
            )
            got = self.call("queries", p.user_id, prompt, QUERIES_SCHEMA, QUERIES_SCHEMA, 1500, _check_candidates)
            if got is None:
                break  # the state stays incomplete: the next run continues from this round
            candidates, problem = got
            state["rounds"] += 1
            if candidates is None:
                state["dropped"].append({"query": "", "reason": "unusable-reply", "detail": problem})
            else:
                for c in candidates:
                    self.judge_candidate(p, state, c)
            state = ckpt.put("state", fp, state)
        self.summary.candidates += len(state["kept"]) + sum(d["reason"] != "unusable-reply" for d in state["dropped"])
        self.summary.kept += len(state["kept"])
        self.summary.dropped.update(d["reason"] for d in state["dropped"])
        for d in state["dropped"]:
            if d["reason"] not in ("duplicate", "over-cap"):
                what = repr(d["query"]) if d["reason"] != "unusable-reply" else "a reply"
                self.note(f"{p.user_id}: {what} dropped: {d['reason']} {d['detail']}".strip())
        if not state["complete"]:
            self.summary.pending["queries (user unfinished)"] += 1
        return list(state["kept"])

    def judge_candidate(self, p: Persona, state: dict[str, Any], candidate: Mapping[str, Any]) -> None:
        query = _squash(candidate.get("query"))
        refs = list(dict.fromkeys(r for r in (_squash(x) for x in candidate.get("references") or []) if r))
        seen = {q["query"].lower() for q in state["kept"]} | {d["query"].lower() for d in state["dropped"]}

        def drop(reason: str, detail: str = "") -> None:
            state["dropped"].append({"query": query, "reason": reason, "detail": detail})

        if not query:
            return drop("empty")
        if query.lower() in seen:
            return drop("duplicate")
        if len(refs) < REFERENCES[0]:
            return drop("too-few-references", f"{len(refs)} references; {REFERENCES[0]} to {REFERENCES[1]} needed")
        refs = refs[: REFERENCES[1]]
        cosine = self.mean_cosine(query, refs)
        if cosine > self.max_cosine:
            return drop("too-similar", f"mean cosine {cosine:.3f} > {self.max_cosine}")
        if len(state["kept"]) >= self.max_queries:
            return drop("over-cap", f"the user already has {self.max_queries} requests")
        k = len(state["kept"]) + 1
        state["kept"].append(
            {
                "id": f"{p.user_id}:q{k}",
                "local": f"q{k}",
                "query": query,
                "category": _squash(candidate.get("category")),
                "references": refs,
                "cosine": round(cosine, 4),
                "date": _query_date(self.seed, p.user_id, k),
            }
        )

    # -- 2. a dated timeline per query, each reference in exactly one event
    def timelines_stage(self) -> None:
        items = [(p, q) for p in self.personas for q in self.queries[p.user_id]]
        for i, (p, q) in enumerate(items, 1):
            ckpt = self.checkpoint("timelines", p.user_id)
            fp = _fingerprint(p.persona, q)
            entry = ckpt.get(q["id"], fp)
            if entry is None:
                entry = self.timeline_for(p, q, ckpt, fp)
            if entry is not None:
                self.timelines[q["id"]] = entry
                if "dropped" in entry:
                    self.summary.dropped["invalid-timeline"] += 1
                    self.note(f"{q['id']}: timeline dropped: {entry['dropped']}")
            self.progress("timelines", i, len(items), "requests")

    def timeline_for(self, p: Persona, q: Mapping[str, Any], ckpt: _Checkpoint, fp: str) -> dict[str, Any] | None:
        prompt = render(
            "mq_timeline",
            persona=p.persona,
            query=q["query"],
            query_date=q["date"],
            references=_numbered(q["references"]),
            min_events=EVENTS[0],
            max_events=EVENTS[1],
        )

        def check(value: Any, final: bool) -> list[dict[str, Any]]:
            return _check_timeline(value, final, n_refs=len(q["references"]), before=date.fromisoformat(q["date"]))

        got = self.call("timelines", q["id"], prompt, TIMELINE_SCHEMA, TIMELINE_CHECK, 1500, check)
        if got is None:
            return None
        events, problem = got
        return ckpt.put(q["id"], fp, {"events": events} if events is not None else {"dropped": problem})

    # -- 3. a dialogue per event, in which its references come up
    def dialogues_stage(self) -> None:
        items = [
            (p, q, j, event)
            for p in self.personas
            for q in self.queries[p.user_id]
            for j, event in enumerate(self.timelines.get(q["id"], {}).get("events", []), 1)
        ]
        for i, (p, q, j, event) in enumerate(items, 1):
            key = f"{q['id']}#e{j}"
            refs = [q["references"][g] for g in event["references"]]
            ckpt = self.checkpoint("dialogues", p.user_id)
            fp = _fingerprint(p.persona, event, refs)
            entry = ckpt.get(key, fp)
            if entry is None:
                entry = self.dialogue_for(p, key, event, refs, ckpt, fp)
            if entry is not None:
                self.dialogues[key] = entry
                if "dropped" in entry:
                    self.summary.dialogues_dropped += 1
                    self.note(f"{key}: dialogue dropped: {entry['dropped']}")
                elif entry["clipped"]:
                    self.summary.clipped_dialogues += 1
            self.progress("dialogues", i, len(items), "events")

    def dialogue_for(
        self, p: Persona, key: str, event: Mapping[str, Any], refs: Sequence[str], ckpt: _Checkpoint, fp: str
    ) -> dict[str, Any] | None:
        prompt = render(
            "mq_dialogue",
            persona=p.persona,
            date=event["date"],
            event=event["event"],
            references=_numbered(refs) if refs else "(none: this is an everyday conversation)",
            min_turns=TURNS[0],
            max_turns=TURNS[1],
        )

        def check(value: Any, final: bool) -> dict[str, Any]:
            return _check_dialogue(value, final, n_refs=len(refs))

        got = self.call("dialogues", key, prompt, DIALOGUE_SCHEMA, DIALOGUE_CHECK, 2500, check)
        if got is None:
            return None
        dialogue, problem = got
        if dialogue is None:
            return ckpt.put(key, fp, {"dropped": problem})
        # tags by the reference's index in its query (local number r -> the event's r-th reference)
        tags = {str(event["references"][r]): positions for r, positions in dialogue["tags"].items()}
        untagged = [event["references"][r] for r in dialogue["untagged"]]
        entry = {"turns": dialogue["turns"], "tags": tags, "untagged": untagged, "clipped": dialogue["clipped"]}
        return ckpt.put(key, fp, entry)

    # -- 4. fact extraction over each user's sessions
    def facts_stage(self) -> None:
        for i, p in enumerate(self.personas, 1):
            sessions = self.sessions_of(p)
            self.sessions[p.user_id] = sessions
            if sessions:
                ckpt = self.checkpoint("facts", p.user_id)
                fp = _fingerprint(sessions, self.extract_name)
                entry = ckpt.get("facts", fp)
                if entry is None:
                    try:
                        facts = _check_facts(self.extract(sessions, p.user_id), p.user_id)
                    except LLMError as exc:
                        self.summary.pending["facts (users)"] += 1
                        self.summary.errors.append(f"facts {p.user_id}: {type(exc).__name__}: {exc}")
                        self.log(f"  memoryquest facts {p.user_id}: extraction failed ({exc}); a rerun retries")
                        facts = None
                    if facts is not None:
                        entry = ckpt.put("facts", fp, {"facts": facts})
                if entry is not None:
                    self.facts[p.user_id] = entry["facts"]
            self.progress("facts", i, len(self.personas), "users")

    def sessions_of(self, p: Persona) -> list[dict[str, Any]]:
        sessions = []
        for q in self.queries[p.user_id]:
            for j, event in enumerate(self.timelines.get(q["id"], {}).get("events", []), 1):
                dialogue = self.dialogues.get(f"{q['id']}#e{j}", {})
                if "turns" in dialogue:
                    sessions.append({"id": f"{q['local']}e{j}", "date": event["date"], "turns": dialogue["turns"]})
        return sorted(sessions, key=lambda s: s["date"])

    # -- 5. one line per user in the documented format
    def assemble(self) -> list[dict[str, Any]]:
        lines = []
        for p in self.personas:
            facts = self.facts.get(p.user_id)
            queries = [q for q in self.queries[p.user_id] if "events" in self.timelines.get(q["id"], {})]
            sessions = self.sessions[p.user_id]
            if facts is None and sessions:
                self.summary.pending["queries (awaiting facts)"] += len(queries)
                continue
            facts = facts or []
            written = [w for w in (self.gold_query(p, q, facts) for q in queries) if w is not None]
            if not written:
                continue
            lines.append(
                {"user_id": p.user_id, "persona": p.persona, "sessions": sessions, "facts": facts, "queries": written}
            )
            self.summary.users_written += 1
            self.summary.written += len(written)
            self.summary.sessions += len(sessions)
            self.summary.turns += sum(len(s["turns"]) for s in sessions)
            self.summary.facts += len(facts)
        pending_timelines = sum(1 for qs in self.queries.values() for q in qs if q["id"] not in self.timelines)
        if pending_timelines:
            self.summary.pending["queries (awaiting a timeline)"] += pending_timelines
        return lines

    def gold_query(self, p: Persona, q: Mapping[str, Any], facts: list[dict[str, Any]]) -> dict[str, Any] | None:
        events = self.timelines[q["id"]]["events"]
        references = []
        for g, text in enumerate(q["references"]):
            j = next(j for j, e in enumerate(events, 1) if g in e["references"])
            dialogue = self.dialogues.get(f"{q['id']}#e{j}")
            if dialogue is None:
                self.summary.pending["queries (awaiting a dialogue)"] += 1
                return None
            if "dropped" in dialogue:
                self.summary.dropped["invalid-dialogue"] += 1
                self.note(f"{q['id']}: dropped: the dialogue of event {j} was dropped")
                return None
            sid = f"{p.user_id}:{q['local']}e{j}"
            ids, by_fallback = _gold_ids(facts, sid, dialogue["tags"].get(str(g)))
            if not ids:
                self.summary.dropped["no-gold-facts"] += 1
                self.note(f"{q['id']}: dropped: reference {g + 1} matches no extracted fact")
                return None
            self.summary.references_by_fallback += by_fallback
            references.append({"text": text, "date": events[j - 1]["date"], "fact_ids": ids})
        out = {"id": q["id"], "query": q["query"], "date": q["date"], "references": references}
        if q.get("category"):
            out["category"] = q["category"]
        return out


def _fact_sessions(fact: Mapping[str, Any]) -> list[str]:
    if isinstance(fact.get("sessions"), list):
        return [str(s) for s in fact["sessions"]]
    return [str(fact["session_id"])] if fact.get("session_id") is not None else []


def _gold_ids(
    facts: Sequence[Mapping[str, Any]], session_id: str, tagged: Sequence[int] | None
) -> tuple[list[str], bool]:
    """The reference's gold: its tagged turns in its session, else the session's user turns, else the
    session's facts. Returns (ids, whether the tags were not enough)."""
    local = session_id.split(":")[-1]
    in_session = [f for f in facts if session_id in _fact_sessions(f) or local in _fact_sessions(f)]
    if tagged:
        chosen = [f for f in in_session if f.get("position") in set(tagged)]
        if chosen:
            return [str(f["id"]) for f in chosen], False
    chosen = [f for f in in_session if f.get("speaker") == "user"] or in_session
    return [str(f["id"]) for f in chosen], True


def _check_facts(facts: Any, user_id: str) -> list[dict[str, Any]]:
    if not isinstance(facts, list):
        raise InvalidArgumentError(f"extract must return a list of fact dicts, got {type(facts).__name__}")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, f in enumerate(facts):
        if not isinstance(f, Mapping) or not _squash(f.get("text")):
            raise InvalidArgumentError(f"extract returned fact {i} of {user_id} without text; every fact needs one")
        fid = str(f.get("id") or f"{user_id}:f{i}")
        if fid in seen:
            raise InvalidArgumentError(f"extract returned fact id {fid!r} twice; ids must be unique per user")
        seen.add(fid)
        out.append({**f, "id": fid})
    return out


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build_memoryquest(
    personas_path: str | Path,
    out_path: str | Path,
    *,
    llm: LLM,
    embedder: Embedder,
    work_dir: str | Path,
    max_queries_per_user: int = 15,
    max_cosine: float = 0.3,
    extract: Extractor | None = None,
    seed: int = 0,
    cache_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Build MemoryQuest from persona profiles into ``out_path`` (JSONL); returns the path.

    Resumable through ``work_dir``; every reply cached under ``cache_dir`` when given. The counts
    (:class:`BuildSummary`) are written to ``work_dir/summary.json`` and logged. An LLM failure never
    raises: the item is skipped and recorded, and the output holds what is complete. Example::

        build_memoryquest(example_personas(), "mq.jsonl", llm=OpenAICompatible(...),
                          embedder=MiniLMEmbedder(), work_dir="mq-work", cache_dir=".pgr-cache/llm")
    """
    if llm is None:
        raise InvalidArgumentError("build_memoryquest needs an LLM: pass llm=OpenAICompatible(...)")
    if max_queries_per_user < 1:
        raise InvalidArgumentError("max_queries_per_user must be >= 1")
    if not -1.0 <= max_cosine <= 1.0:
        raise InvalidArgumentError("max_cosine is a cosine: pass a number between -1 and 1 (the paper: 0.3)")
    personas = load_personas(personas_path)
    out, work = Path(out_path), Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    if cache_dir is not None and not isinstance(llm, CachedLLM):
        llm = CachedLLM(llm, cache_dir)
    build = _Build(
        personas,
        llm=llm,
        embedder=embedder,
        work_dir=work,
        max_queries=max_queries_per_user,
        max_cosine=max_cosine,
        extract=extract or raw_facts,
        seed=seed,
        log=log or _say,
    )
    build.queries_stage()
    build.timelines_stage()
    build.dialogues_stage()
    build.facts_stage()
    lines = build.assemble()
    _write_atomic(out, "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    summary = build.summary.to_dict()
    if isinstance(llm, CachedLLM):
        summary["llm_cache"] = {"root": str(llm.root), "hits": llm.stats.hits, "misses": llm.stats.misses}
    summary["out"] = str(out)
    _write_atomic(work / "summary.json", json.dumps(summary, ensure_ascii=False, indent=2))
    build.log(build.summary.line())
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Build a MemoryQuest data set from persona profiles (resumable: rerun the same command)."""
    import argparse

    from pgr_core.cli.common import _embedder, add_llm_options, required_llm

    ap = argparse.ArgumentParser(description="build a MemoryQuest data set from persona profiles with an LLM")
    ap.add_argument("--personas", type=Path, default=example_personas(), help="JSONL of {user_id, persona} lines")
    ap.add_argument("--out", type=Path, required=True, help="the data set to write (JSONL, docs/eval-format.md)")
    ap.add_argument("--work", type=Path, required=True, help="checkpoint folder: rerun with it to resume")
    ap.add_argument("--cache", type=Path, default=None, help="LLM reply cache folder")
    ap.add_argument("--max-queries", type=int, default=15, help="requests per user (the paper: 15)")
    ap.add_argument("--max-cosine", type=float, default=0.3, help="mean query-reference cosine allowed (0.3)")
    ap.add_argument("--seed", type=int, default=0, help="draws the requests' dates")
    ap.add_argument("--embedder", choices=["minilm", "hashing"], default="minilm", help="for the cosine filter")
    add_llm_options(ap)
    args = ap.parse_args(argv)
    say = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    try:
        llm = required_llm(args, "memoryquest build")
    except Exception as exc:  # a missing LLM: one line, as pgr's own commands say it
        say(f"memoryquest: error: {exc}")
        return 2
    out = build_memoryquest(
        args.personas,
        args.out,
        llm=llm,
        embedder=_embedder(args.embedder),
        work_dir=args.work,
        cache_dir=args.cache,
        max_queries_per_user=args.max_queries,
        max_cosine=args.max_cosine,
        seed=args.seed,
        log=say,
    )
    print((args.work / "summary.json").read_text(encoding="utf-8"))
    say(f"written: {out} (load it with `pgr eval memoryquest --data {out}`)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
