"""Consolidation: near-duplicate facts of the same week become one fact, atomically per cluster.

In the order it runs:

1. cluster a user's facts by cosine similarity (every pair in a cluster at least ``threshold``),
   admitting a fact only while the cluster's latest dates stay within ``window_days`` (7) of each
   other; undated facts and raw turns are left alone;
2. one LLM merge per cluster (without an LLM: the most repeated, then latest, wording is kept);
3. the merged fact sums the frequencies, unions provenance and entities, and records the ids it
   replaces (``metadata["merged_from"]``);
4. the swap goes through a write-ahead :class:`Journal`: intent (the merged fact and the originals,
   flushed to disk) → add the merged fact → delete the originals → checkpoint the store → commit.

If the LLM fails, nothing of that cluster is written. If the process dies anywhere in step 4, the
next :class:`Consolidator` on the same store and journal rolls every uncommitted intent forward: the
merged fact has a fixed id (derived from the ids it replaces), so adding it again replaces it, and
deleting originals already gone deletes nothing. No fact is lost and none is duplicated.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from ..embedders import Embedder
from ..errors import InvalidArgumentError, LLMError, LLMOutputError
from ..llm import LLM, parse_json
from ..prompts import render
from ..types import Fact, Scope
from .guideline import FACT_TYPES
from .sessions import scope_label
from .stores import FactWriter, fact_from_dict, latest_date, writer_for

__all__ = ["ConsolidationReport", "Consolidator", "Journal", "MERGE_SCHEMA"]

MERGE_SCHEMA = {
    "type": "object",
    "required": ["text"],
    "properties": {"text": {"type": "string"}, "type": {"type": "string"}},
}

# the points of the swap where a test can make the process "die" (see Consolidator.fault)
FAULT_POINTS = ("intent", "added", "deleted", "checkpointed", "committed")


@dataclass
class ConsolidationReport:
    scope: str
    facts_before: int = 0
    facts_after: int = 0
    clusters: int = 0  # clusters of two or more facts found
    merged: int = 0  # clusters merged
    failed: list[str] = field(default_factory=list)  # clusters left alone, and why
    recovered: int = 0  # uncommitted swaps rolled forward when the consolidator opened
    llm_calls: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Journal:
    """Write-ahead record of cluster swaps: ``intent`` lines (with full facts) and ``commit`` lines.

    In memory when ``path`` is None. Each line is flushed and fsynced before the store is touched; a
    line torn by a crash is ignored (its swap had not started).
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._lines: list[dict[str, Any]] = []
        if self.path is not None and self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    self._lines.append(json.loads(line))
                except json.JSONDecodeError:
                    continue

    def _write(self, record: dict[str, Any]) -> None:
        self._lines.append(record)
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def intent(self, swap: str, merged: Fact, originals: Sequence[Fact]) -> None:
        self._write(
            {"op": "intent", "swap": swap, "merged": merged.to_dict(), "originals": [f.to_dict() for f in originals]}
        )

    def commit(self, swap: str) -> None:
        self._write({"op": "commit", "swap": swap})

    def pending(self) -> list[tuple[str, Fact, list[Fact]]]:
        """Intents without a commit, oldest first."""
        committed = {r["swap"] for r in self._lines if r.get("op") == "commit"}
        out = []
        for r in self._lines:
            if r.get("op") == "intent" and r["swap"] not in committed:
                out.append((r["swap"], fact_from_dict(r["merged"]), [fact_from_dict(f) for f in r["originals"]]))
        return out

    def clear(self) -> None:
        """Forget committed history (only when nothing is pending)."""
        if self.pending():
            return
        self._lines = []
        if self.path is not None and self.path.exists():
            tmp = self.path.with_suffix(self.path.suffix + ".tmp")
            tmp.write_text("", encoding="utf-8")
            tmp.replace(self.path)


class Consolidator:
    """Merges near-duplicate facts of one user, cluster by cluster, through a journal.

    >>> consolidator = Consolidator(store, llm=llm, journal=Journal("store.pgr.journal.jsonl"),
    ...                             checkpoint=lambda: store.save("store.pgr"))  # doctest: +SKIP
    >>> consolidator.consolidate(Scope(user_id="u1")).merged  # doctest: +SKIP

    Opening a consolidator rolls forward any swap a crash left uncommitted (``self.recovered``).
    The store must be able to list, replace and delete facts by id (InMemoryStore can).
    ``fault`` is for tests: called with each point of the swap (``FAULT_POINTS``); raising there
    simulates the process dying at that point.
    """

    def __init__(
        self,
        store: Any,
        llm: LLM | None = None,
        *,
        threshold: float = 0.85,
        window_days: float = 7.0,
        max_cluster: int = 8,
        journal: Journal | None = None,
        checkpoint: Callable[[], Any] | None = None,
        embedder: Embedder | None = None,
        include_turns: bool = False,
        types: Sequence[str] = tuple(FACT_TYPES),
        max_tokens: int = 300,
        fault: Callable[[str], None] | None = None,
    ) -> None:
        if not 0.0 < threshold <= 1.0:
            raise InvalidArgumentError(f"threshold must be in (0, 1], got {threshold!r}")
        if window_days < 0 or max_cluster < 2:
            raise InvalidArgumentError("window_days must be >= 0 and max_cluster >= 2")
        self.writer: FactWriter = writer_for(store)
        self.writer.require_rewrite("consolidation")
        self.llm = llm
        self.threshold = threshold
        self.window = timedelta(days=window_days)
        self.max_cluster = max_cluster
        self.journal = journal if journal is not None else Journal()
        self.checkpoint = checkpoint
        self.embedder = embedder
        self.include_turns = include_turns
        self.types = list(types)
        self.max_tokens = max_tokens
        self.fault = fault
        self.recovered = self.recover()

    # ================================================================== recovery

    def recover(self) -> int:
        """Roll every uncommitted swap forward; returns how many there were."""
        pending = self.journal.pending()
        for swap, merged, originals in pending:
            self.writer.put([merged])
            self.writer.remove(f.id for f in originals if f.id != merged.id)
            if self.checkpoint is not None:
                self.checkpoint()
            self.journal.commit(swap)
        if pending:
            self.journal.clear()
        return len(pending)

    # ================================================================== the steps

    def candidates(self, scope: Scope) -> list[Fact]:
        """The facts that may be merged: the scope's, dated, and not raw turns (unless asked)."""
        return [
            f
            for f in self.writer.facts_of(scope)
            if latest_date(f) is not None and (self.include_turns or f.type != "turn")
        ]

    def clusters(self, facts: Sequence[Fact]) -> list[list[Fact]]:
        """Complete-linkage clusters at ``threshold`` whose latest dates span at most ``window_days``."""
        if len(facts) < 2:
            return []
        vectors = self.writer.embed([f.text for f in facts], self.embedder)
        sims = np.asarray(vectors, dtype=np.float32) @ np.asarray(vectors, dtype=np.float32).T
        dates = [latest_date(f) for f in facts]
        order = sorted(range(len(facts)), key=lambda i: (dates[i], facts[i].id))
        taken: set[int] = set()
        out: list[list[Fact]] = []
        for i in order:
            if i in taken:
                continue
            members = [i]
            near = sorted(
                (j for j in order if j not in taken and j != i and sims[i, j] >= self.threshold),
                key=lambda j: -sims[i, j],
            )
            for j in near:
                if len(members) >= self.max_cluster:
                    break
                if all(sims[j, m] >= self.threshold for m in members) and self._within_window(
                    [dates[m] for m in [*members, j]]
                ):
                    members.append(j)
            if len(members) > 1:
                taken.update(members)
                out.append([facts[m] for m in members])
        return out

    def _within_window(self, dates: Sequence[Any]) -> bool:
        return max(dates) - min(dates) <= self.window

    def merge_text(self, cluster: Sequence[Fact], report: ConsolidationReport) -> tuple[str, str | None]:
        """One LLM call for the cluster's merged wording and type (raises LLMError on failure)."""
        if self.llm is None:
            kept = max(cluster, key=lambda f: (_frequency(f), latest_date(f), f.id))
            return kept.text, Counter(f.type for f in cluster).most_common(1)[0][0]
        lines = "\n".join(
            f"- [{f.type or 'untyped'}, {latest_date(f).date().isoformat()}] {f.text}"  # type: ignore[union-attr]
            for f in cluster
        )
        messages = [{"role": "user", "content": render("write_merge", facts=lines, type_names=", ".join(self.types))}]
        report.llm_calls += 1
        completion = self.llm.complete(messages, schema=MERGE_SCHEMA, max_tokens=self.max_tokens)
        if completion.truncated:
            raise LLMOutputError("the merge reply was cut off", raw=completion.text)
        reply = parse_json(completion.text, MERGE_SCHEMA)
        text = " ".join(str(reply.get("text") or "").split())
        if not text:
            raise LLMOutputError("the merge reply has empty text", raw=completion.text)
        by_name = {t.lower(): t for t in self.types}
        kind = (
            by_name.get(str(reply.get("type") or "").lower()) or Counter(f.type for f in cluster).most_common(1)[0][0]
        )
        return text, kind

    def merged_fact(self, cluster: Sequence[Fact], text: str, kind: str | None) -> Fact:
        """The fact replacing ``cluster``: frequencies summed, provenance and entities unioned."""
        ids = sorted(f.id for f in cluster)
        digest = hashlib.sha1("\n".join(ids).encode("utf-8")).hexdigest()[:16]
        scope = cluster[0].scope
        sessions: list[str] = []
        entities: list[str] = []
        for f in cluster:
            sessions += [s for s in f.metadata.get("sessions") or [] if s not in sessions]
            entities += [e for e in f.metadata.get("entities") or [] if e not in entities]
        dated = [f.date for f in cluster if f.date is not None]
        metadata = {
            "frequency": sum(_frequency(f) for f in cluster),
            "sessions": sessions,
            "entities": entities,
            "merged_from": ids,
            "source": "merged",
            "merged_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        return Fact(
            id=f"{scope_label(scope)}:m{digest}",
            text=text,
            scope=scope,
            type=kind,
            date=min(dated) if dated else None,
            updated_at=max(latest_date(f) for f in cluster),  # type: ignore[type-var]
            metadata=metadata,
        )

    def swap(self, merged: Fact, originals: Sequence[Fact]) -> None:
        """intent → add merged → delete originals → checkpoint → commit (see the module docstring)."""
        swap = merged.id
        self.journal.intent(swap, merged, originals)
        self._at("intent")
        self.writer.put([merged])
        self._at("added")
        self.writer.remove(f.id for f in originals if f.id != merged.id)
        self._at("deleted")
        if self.checkpoint is not None:
            self.checkpoint()
        self._at("checkpointed")
        self.journal.commit(swap)
        self._at("committed")

    def _at(self, point: str) -> None:
        if self.fault is not None:
            self.fault(point)

    # ================================================================== public API

    def consolidate(self, scope: Scope | Any) -> ConsolidationReport:
        """Cluster and merge one user's facts. LLM failures leave their cluster as it was."""
        scope = Scope.coerce(scope)
        report = ConsolidationReport(scope_label(scope), recovered=self.recovered)
        facts = self.candidates(scope)
        report.facts_before = len(self.writer.facts_of(scope))
        groups = self.clusters(facts)
        report.clusters = len(groups)
        for cluster in groups:
            try:
                text, kind = self.merge_text(cluster, report)
            except LLMError as exc:
                report.failed.append(f"{[f.id for f in cluster]}: {type(exc).__name__}: {exc}")
                continue
            self.swap(self.merged_fact(cluster, text, kind), cluster)
            report.merged += 1
        self.journal.clear()
        report.facts_after = len(self.writer.facts_of(scope))
        return report


def _frequency(fact: Fact) -> int:
    try:
        return max(1, int(fact.metadata.get("frequency", 1) or 1))
    except (TypeError, ValueError):
        return 1
