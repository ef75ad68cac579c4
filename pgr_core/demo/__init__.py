"""The bundled demo: one person's dated chat history and three under-specified questions.

``history.json`` is written for pgr (no third-party data): 20 sessions, January to April 2025, one
fact per user turn, and for each question the turns that matter and why. ``replies.json`` holds the
replies a capable model wrote to PGR's requests for these questions (through llm-relay, with the
MiniLM embedder: other embeddings find other records, so other prompts), which ``pgr demo`` replays
when no LLM is configured (:func:`recorded_llm`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from pgr_core.models.embedders import Embedder
from pgr_core.models.recorded import RecordedLLM
from pgr_core.observability.trace import RetrievalResult
from pgr_core.policy.pgr import PGR
from pgr_core.stores.memory import InMemoryStore
from pgr_core.types import Fact, Scope

__all__ = ["RECORDED_WITH", "DemoQuery", "build_store", "load_history", "recorded_llm", "run_demo"]

RECORDED_WITH = "all-MiniLM-L6-v2"  # the embedder the recorded replies' prompts were built with


def recorded_llm() -> RecordedLLM:
    """The capable model's recorded replies for the bundled questions (see the module docstring)."""
    text = resources.files(__package__).joinpath("replies.json").read_text(encoding="utf-8")
    return RecordedLLM(json.loads(text), name="recorded capable model")


def load_history() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("history.json").read_text(encoding="utf-8")
    return json.loads(text)


def history_facts(history: dict[str, Any]) -> list[Fact]:
    """One dated fact per turn, with its session and position (so the temporal window works)."""
    from pgr_core._dates import parse_date

    scope = Scope(user_id=history["person"]["user_id"])
    return [
        Fact(
            id=f"{session['id']}:{i}",
            text=turn,
            scope=scope,
            type="turn",
            date=parse_date(session["date"]),
            session_id=session["id"],
            position=i,
        )
        for session in history["sessions"]
        for i, turn in enumerate(session["turns"])
    ]


def build_store(embedder: Embedder | None = None, history: dict[str, Any] | None = None) -> InMemoryStore:
    store = InMemoryStore(embedder=embedder)
    store.add_facts(history_facts(history or load_history()))
    return store


@dataclass
class DemoQuery:
    query: str
    date: str
    query_only: RetrievalResult
    pgr: RetrievalResult
    relevant: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)

    @property
    def budget(self) -> int:
        """The number of facts both lists are compared at: the query-only list's size."""
        return len(self.query_only.facts)

    @property
    def pgr_ids(self) -> list[str]:
        """PGR's R* cut to the same number of facts as the query-only list."""
        return [f.id for f in self.pgr.top(self.budget)]

    @property
    def only_pgr(self) -> list[str]:
        """Facts in PGR's list at the same size that the query-only list does not hold."""
        baseline = set(self.query_only.ids)
        return [i for i in self.pgr_ids if i not in baseline]

    def to_dict(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "date": self.date,
            "budget": self.budget,
            "query_only": self.query_only.ids,
            "pgr": self.pgr_ids,
            "pgr_all": self.pgr.ids,
            "only_pgr": self.only_pgr,
            "relevant": self.relevant,
            "relevant_found": {
                "query_only": [i for i in self.relevant if i in set(self.query_only.ids)],
                "pgr": [i for i in self.relevant if i in set(self.pgr_ids)],
                "pgr_all": [i for i in self.relevant if i in set(self.pgr.ids)],
            },
            "summary": self.pgr.summary,
            "trace": self.pgr.trace.to_dict(),
        }

    def page_item(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "date": self.date,
            "query_only": self.query_only.to_dict(),
            "pgr": self.pgr.to_dict(),
            "relevant": self.relevant,
            "why": self.why,
        }


def run_demo(
    pgr: PGR, history: dict[str, Any] | None = None, progress: Callable[[str], None] | None = None
) -> list[DemoQuery]:
    """Run every demo question through query-only and PGR on ``pgr``'s store."""
    history = history or load_history()
    scope = Scope(user_id=history["person"]["user_id"])
    out = []
    for q in history["questions"]:
        if progress:
            progress(f"question {q['id']}: {q['query']}")
        out.append(
            DemoQuery(
                query=q["query"],
                date=q["date"],
                query_only=pgr.query_only(q["query"], scope=scope, date=q["date"]),
                pgr=pgr.retrieve(q["query"], scope=scope, date=q["date"]),
                relevant=list(q.get("relevant", [])),
                why=dict(q.get("why", {})),
            )
        )
    return out
