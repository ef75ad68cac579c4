"""Cues: prospection at write time.

For every fact an LLM writes a few short *cues*, the later requests and situations in which the fact
would change the answer ("should I join a soccer league this summer?" for a knee operation). Cues are
embedded beside the fact (:class:`~pgr_core.anticipation.anticipating.Anticipating`), so an under-specified request
meets the fact by similarity alone, with no LLM call in the query path.

- :class:`CueWriter`: one LLM call per session (all of its new and updated facts at once), checked cue
  by cue, one repair call for the facts whose cues were unusable; a fact still without cues is left
  for the next build.
- :class:`CueCache`: cues by fact text (SQLite), so a rebuild, a second store or an eval rerun asks
  the model only about facts it has never seen.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from pgr_core.errors import ConfigurationError, InvalidArgumentError, LLMError, LLMOutputError
from pgr_core.models.llm import LLM, Completion, complete_objects, parse_json
from pgr_core.models.prompts import prompt, render
from pgr_core.policy.prospectors import quoted
from pgr_core.types import Fact

__all__ = [
    "CUE_SCHEMA",
    "MAX_CUE_WORDS",
    "CueBatch",
    "CueCache",
    "CueWriter",
    "check_cues",
    "reply_schema",
]

CUE_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "required": ["cues"],
    "properties": {
        "cues": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "cues"],
                "properties": {"id": {"type": "string"}, "cues": {"type": "array", "items": {"type": "string"}}},
            },
        }
    },
}

_CUE_ITEM: Mapping[str, Any] = CUE_SCHEMA["properties"]["cues"]["items"]  # one fact's entry

MAX_CUE_WORDS = 12
_MAX_CUE_CHARS = 160  # a cue string's ceiling in the reply's grammar: 12 words fit, a run-on line does not
MIN_CUES = 2
MAX_CUES = 4
DEFAULT_CUES = 4  # cues asked per fact
_MAX_FACT_CHARS = 400
RETRY_TEMPERATURE = 0.7  # a fact the model failed on is asked again at this temperature, not the same call
MAX_FACTS_PER_CALL = 24  # a session with more new facts is asked about in parts (rare: sessions hold 1-10)
_WORD = re.compile(r"[\w']+", re.UNICODE)
_STOP = frozenset(
    "a an the and or but of to in on at for with by from is are was were be been am i my me you your "
    "user user's their they them she he her his it its this that these those has have had do does did "
    "will would can could should about into as so not no".split()
)


def reply_schema(handles: Sequence[str], cues_per_fact: int) -> dict[str, Any]:
    """The schema one cue call is sent: :data:`CUE_SCHEMA`, bounded to the facts asked.

    At most one entry per fact asked, each named by one of ``handles``, with at most ``cues_per_fact``
    cues of at most :data:`_MAX_CUE_CHARS` characters. A server that constrains decoding to the schema
    (llama.cpp turns it into a grammar) then closes the reply when every fact is answered: the local
    1.5B model otherwise went on inventing facts (``F23``... ``F53`` for a 22-turn session) until
    ``max_tokens``: minutes of tokens for entries nobody asked for. A reply the bounds do not
    bind is the reply an unbounded schema gives; a server that does not constrain decoding reads it as
    a hint, and the reply is read as before (entries for unknown ids are ignored).
    """
    fields = _CUE_ITEM["properties"]
    cues = fields["cues"]
    item = {
        **_CUE_ITEM,
        "properties": {
            "id": {**fields["id"], "enum": list(handles)},
            "cues": {**cues, "items": {**cues["items"], "maxLength": _MAX_CUE_CHARS}, "maxItems": cues_per_fact},
        },
    }
    entries = {**CUE_SCHEMA["properties"]["cues"], "items": item, "maxItems": len(handles)}
    return {**CUE_SCHEMA, "properties": {"cues": entries}}


def text_key(text: str) -> str:
    """A fact text's key: the SHA-256 of its words (spacing does not count)."""
    return hashlib.sha256(" ".join(text.split()).encode("utf-8")).hexdigest()


def _content_words(text: str) -> set[str]:
    return {w[:6] for w in (m.group(0).lower() for m in _WORD.finditer(text)) if w not in _STOP and len(w) > 2}


def check_cues(
    cues: Any, fact_text: str, *, limit: int = MAX_CUES, avoid: Iterable[str] = ()
) -> tuple[list[str], list[str]]:
    """The usable cues of one fact, and why each other one was refused.

    A cue is one line of at most :data:`MAX_CUE_WORDS` words (longer ones are cut at a word), not a
    restatement of the fact (at most half of its content words may come from the fact), not a repeat
    of an earlier cue, and not one of ``avoid`` (the worked example's cues, which a small model copies
    onto unrelated facts). At most ``limit`` are kept.
    """
    copied = {" ".join(a.lower().split()) for a in avoid}
    kept: list[str] = []
    refused: list[str] = []
    if not isinstance(cues, list):
        return [], [f"cues should be a list, got {type(cues).__name__}"]
    fact_words = _content_words(fact_text)
    seen: set[str] = set()
    for i, cue in enumerate(cues):
        if not isinstance(cue, str):
            refused.append(f"cue {i}: not text")
            continue
        words = " ".join(cue.split()).strip(" \"'").split(" ")
        text = " ".join(words[:MAX_CUE_WORDS]).strip()
        if not text:
            refused.append(f"cue {i}: empty")
            continue
        mine = _content_words(text)
        if not mine:
            refused.append(f"cue {i}: no content words")
            continue
        if fact_words and len(mine & fact_words) > len(mine) / 2:
            refused.append(f"cue {i}: restates the fact")
            continue
        if text.lower() in seen:
            refused.append(f"cue {i}: a repeat")
            continue
        if text.lower() in copied:
            refused.append(f"cue {i}: copied from the example")
            continue
        seen.add(text.lower())
        kept.append(text)
        if len(kept) == limit:
            break
    return kept, refused


@dataclass
class CueBatch:
    """What one :meth:`CueWriter.write` produced: cues by fact id, the facts left without cues, why
    cues were refused, the LLM's replies, and how many facts came from the cache."""

    cues: dict[str, tuple[str, ...]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    cached: int = 0
    errors: list[str] = field(default_factory=list)
    transient: list[str] = field(default_factory=list)  # missing because the call failed, not the reply
    skipped: int = 0  # missing because the cache records an earlier unusable reply (retry_failed=False)
    why: dict[str, str] = field(default_factory=dict)  # fact id -> why it got no cue, in words

    @property
    def calls(self) -> int:
        return len(self.completions)

    @property
    def tokens(self) -> int:
        return sum(c.usage.total_tokens for c in self.completions)

    def merge(self, other: CueBatch) -> None:
        self.cues.update(other.cues)
        self.missing.extend(other.missing)
        self.refused.extend(other.refused)
        self.completions.extend(other.completions)
        self.cached += other.cached
        self.errors.extend(other.errors)
        self.transient.extend(other.transient)
        self.skipped += other.skipped
        self.why.update(other.why)


def without_cues(batch: CueBatch, session: str) -> list[dict[str, Any]]:
    """The facts of one session's batch left without cues, grouped by why: ``{"session", "facts", "why"}``."""
    by_reason: dict[str, list[str]] = {}
    for fid in batch.missing:
        by_reason.setdefault(batch.why.get(fid, "no usable cue"), []).append(fid)
    return [{"session": session, "facts": ids, "why": why} for why, ids in by_reason.items()]


class CueCache:
    """Cues by fact text, in a SQLite file (or in memory with ``path=None``), keyed by the writer's
    identity (model, prompt, cues per fact) so a changed prompt never serves stale cues."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(str(self.path) if self.path else ":memory:", check_same_thread=False, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS cues "
                "(writer TEXT, text_key TEXT, cues TEXT, PRIMARY KEY (writer, text_key))"
            )
            self._db.commit()
        except sqlite3.DatabaseError as exc:
            raise ConfigurationError(f"cue cache {self.path} is not a usable SQLite file: {exc}") from exc
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CueCache({str(self.path) if self.path else None!r})"

    def get_many(self, writer: str, texts: Iterable[str]) -> dict[str, tuple[str, ...]]:
        wanted = {text_key(t): t for t in texts}
        out: dict[str, tuple[str, ...]] = {}
        with self._lock:
            keys = list(wanted)
            for start in range(0, len(keys), 500):
                part = keys[start : start + 500]
                rows = self._db.execute(
                    f"SELECT text_key, cues FROM cues WHERE writer = ? AND text_key IN ({','.join('?' * len(part))})",
                    (writer, *part),
                ).fetchall()
                for key, value in rows:
                    try:
                        cues = json.loads(value)
                    except ValueError:
                        continue  # unreadable: ask again
                    if isinstance(cues, list) and all(isinstance(c, str) for c in cues):
                        out[wanted[key]] = tuple(cues)
        return out

    def put_many(self, writer: str, items: Mapping[str, Sequence[str]]) -> None:
        rows = [(writer, text_key(text), json.dumps(list(cues), ensure_ascii=False)) for text, cues in items.items()]
        if not rows:
            return
        with self._lock:
            self._db.executemany("INSERT OR REPLACE INTO cues VALUES (?, ?, ?)", rows)
            self._db.commit()

    def close(self) -> None:
        with self._lock:
            self._db.close()


class CueWriter:
    """Writes the cues of a session's facts with one LLM call.

    ``cues_per_fact`` (2-4) is what the prompt asks for; a fact keeps at least two usable cues or none.
    ``max_tokens`` caps a reply (default: room for every fact's cues, at most 4,096).
    A fact the model answered unusably twice (the reply and its repair) is recorded in the cache as
    such and asked again on the next write unless ``retry_failed`` is False, on its own call at
    :data:`RETRY_TEMPERATURE` at least (at temperature 0 the same call would give the same reply); a
    fact left by a timeout or an unreachable server is simply asked again.
    Facts are shown to the model as quoted data (``F1``, ``F2``... handles), so a fact that reads like
    an instruction is read, not obeyed. ``cache`` (a :class:`CueCache`) serves facts by text.
    """

    def __init__(
        self,
        llm: LLM,
        *,
        cues_per_fact: int = DEFAULT_CUES,
        cache: CueCache | None = None,
        max_tokens: int | None = None,
        temperature: float = 0.0,
    ) -> None:
        if (
            isinstance(cues_per_fact, bool)
            or not isinstance(cues_per_fact, int)
            or not MIN_CUES <= cues_per_fact <= MAX_CUES
        ):
            raise InvalidArgumentError(
                f"cues_per_fact must be an integer from {MIN_CUES} to {MAX_CUES}, got {cues_per_fact!r}"
            )
        self.llm = llm
        self.cues_per_fact = cues_per_fact
        self.cache = cache
        self.max_tokens = max_tokens
        self.temperature = temperature
        #: ask again about facts the cache records as answered unusably (``pgr cues build``: yes;
        #: ``pgr eval --cues``: no, so a rerun makes no call the first run could not use)
        self.retry_failed = True
        self.identity = self.identity_for(str(getattr(llm, "model", None) or llm.name), cues_per_fact)
        example_facts, example_reply = (part.strip() for part in render("cues_example").split("\n---\n"))
        reply = json.loads(example_reply)
        # the worked example, read once, its cues cut to as many as asked (it holds MAX_CUES a fact)
        shown = {"cues": [{**item, "cues": item["cues"][:cues_per_fact]} for item in reply["cues"]]}
        self._example_turn = (example_facts, json.dumps(shown))
        self._example = frozenset(" ".join(c.lower().split()) for item in reply["cues"] for c in item["cues"])

    def __repr__(self) -> str:
        return f"CueWriter({self.llm!r}, cues_per_fact={self.cues_per_fact})"

    @staticmethod
    def identity_for(model: str, cues_per_fact: int = DEFAULT_CUES) -> str:
        """What the cue cache keys a writer's cues by: the model, the prompt's digest, cues per fact."""
        digest = hashlib.sha256(prompt("cues").encode("utf-8")).hexdigest()[:12]
        return f"{model}|cues-{digest}|{cues_per_fact}"

    def check(self, cues: Any, fact_text: str) -> tuple[list[str], list[str]]:
        """One fact's usable cues and the reasons the others were refused (:func:`check_cues`)."""
        return check_cues(cues, fact_text, avoid=self._example)

    def _max_tokens(self, facts: int) -> int:
        """The reply's ceiling: ``max_tokens`` when given, else room for every fact's cues."""
        return self.max_tokens or min(4096, 150 + 40 * self.cues_per_fact * facts)

    def messages(self, facts: Sequence[Fact]) -> list[dict[str, str]]:
        lines = [f"F{i}: {quoted(f.text, _MAX_FACT_CHARS)}" for i, f in enumerate(facts, 1)]
        example_facts, example_reply = self._example_turn
        ask = partial(render, "cues", count=self.cues_per_fact)
        return [  # one worked example as an earlier exchange: a small model copies a shape, not content
            {"role": "user", "content": ask(facts=example_facts)},
            {"role": "assistant", "content": example_reply},
            {"role": "user", "content": ask(facts="\n".join(lines))},
        ]

    def write(self, facts: Sequence[Fact]) -> CueBatch:
        """Cues for ``facts`` (one session's): from the cache where it has them, else one call per
        :data:`MAX_FACTS_PER_CALL` facts and at most one repair. Never raises for the model's sake: a
        reply that is unusable, late or refused leaves its facts in ``missing`` (and the reason in
        ``errors``) for the next build."""
        batch = CueBatch()
        todo: list[Fact] = []
        again: list[Fact] = []  # answered unusably before: the same call at temperature 0 would fail again
        known = self.cache.get_many(self.identity, [f.text for f in facts]) if self.cache else {}
        for fact in facts:
            hit = known.get(fact.text)
            if hit == () and not self.retry_failed:  # the model gave it no usable cue before
                batch.missing.append(fact.id)
                batch.skipped += 1
                batch.why[fact.id] = "the model gave it no usable cue before (the cache says so); a build asks again"
                continue
            if hit is not None:  # cached before the example check existed: held to it now
                hit = tuple(c for c in hit if " ".join(c.lower().split()) not in self._example)
            if hit is not None and len(hit) >= MIN_CUES:
                batch.cues[fact.id] = hit
                batch.cached += 1
            else:
                (again if hit == () else todo).append(fact)
        retry = max(self.temperature, RETRY_TEMPERATURE)
        for group, temperature in ((todo, self.temperature), (again, retry)):
            for start in range(0, len(group), MAX_FACTS_PER_CALL):
                batch.merge(self._ask(group[start : start + MAX_FACTS_PER_CALL], temperature))
        if self.cache:
            by_id = {f.id: f for f in facts}
            written: dict[str, Sequence[str]] = {by_id[i].text: c for i, c in batch.cues.items() if i in by_id}
            # a fact the model answered unusably, after the repair, is recorded as such (an empty
            # list); one left by a timeout or an outage is not: that is no verdict on the fact
            failed: dict[str, Sequence[str]] = {
                by_id[i].text: () for i in batch.missing if i in by_id and i not in batch.transient
            }
            self.cache.put_many(self.identity, failed | written)
        return batch

    def _ask(self, facts: list[Fact], temperature: float) -> CueBatch:
        batch = CueBatch()
        messages = self.messages(facts)
        handles = {f"F{i}": fact for i, fact in enumerate(facts, 1)}
        pending = dict(handles)
        for attempt in range(2):
            try:
                completion = self.llm.complete(
                    messages,
                    schema=reply_schema(list(pending), self.cues_per_fact),
                    max_tokens=self._max_tokens(len(facts)),
                    temperature=temperature,
                )
            except LLMError as exc:
                batch.errors.append(f"{type(exc).__name__}: {exc}")
                batch.transient.extend(f.id for f in pending.values())
                failed = f"the call failed ({type(exc).__name__}); asked again next build"
                batch.why.update((f.id, failed) for f in pending.values())
                break
            batch.completions.append(completion)
            problem = self._read(completion, pending, batch)
            if not pending or attempt == 1:
                for handle, fact in pending.items():
                    refused = [r.split(" ", 1)[1] for r in batch.refused if r.split(" ", 1)[0] == handle]
                    batch.why[fact.id] = (
                        f"its cues were refused after a repair ({'; '.join(refused[-4:])})"
                        if refused
                        else f"the reply gave it no usable entry after a repair ({problem[:200]})"
                    )
                break
            messages = [
                *messages,
                {"role": "assistant", "content": completion.text[:3000]},
                {"role": "user", "content": render("repair", problem=problem)},
            ]
        batch.missing.extend(f.id for f in pending.values())
        return batch

    def _read(self, completion: Completion, pending: dict[str, Fact], batch: CueBatch) -> str:
        """Take the usable cues of ``completion`` for the facts still ``pending``; return the problem.

        A reply cut off at the token limit (the small model sometimes repeats itself until it is) keeps
        the entries it completed before the cut; the facts after it are the problem the repair names."""
        cut = ""
        try:
            if completion.truncated:
                cut = "the reply was cut off at the token limit"
                items = complete_objects(completion.text, _CUE_ITEM, key="id")
                if not items:
                    raise LLMOutputError(cut, raw=completion.text)
                batch.errors.append(f"{cut}; {len(items)} complete entries before the cut kept")
            else:
                items = parse_json(completion.text, CUE_SCHEMA)["cues"]
        except LLMOutputError as exc:
            batch.errors.append(str(exc))
            return str(exc)
        short: list[str] = []
        for item in items:
            handle = str(item.get("id") or "").strip().upper()
            fact = pending.get(handle)
            if fact is None:
                continue  # an unknown or already answered id
            kept, refused = self.check(item.get("cues"), fact.text)
            batch.refused.extend(f"{handle} {r}" for r in refused)
            if len(kept) >= MIN_CUES:
                batch.cues[fact.id] = tuple(kept)
                del pending[handle]
            else:
                short.append(handle)
        unanswered = [h for h in pending if h not in short]
        parts = [cut] if cut and pending else []
        if short:
            parts.append(f"facts {', '.join(short)} need at least {MIN_CUES} cues that do not repeat the fact's words")
        if unanswered:
            parts.append(f"facts {', '.join(unanswered)} got no entry")
        return "; ".join(parts) or "ok"
