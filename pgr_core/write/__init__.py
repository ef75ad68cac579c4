"""The write side: conversation logs in, a consolidated fact memory out, and a guideline that learns.

- :class:`Ingestor` (``pgr ingest``): sessions in, facts out, through any writable store; raw turns
  without an LLM, typed facts with upserts under a guideline S with one. Idempotent and resumable.
- :class:`Consolidator` (``pgr consolidate``): near-duplicates of the same week merged, one LLM call
  per cluster, atomically through a write-ahead :class:`Journal` (JSON lines) or
  :class:`SqliteJournal` (a directory store's ``journal.sqlite3``; :func:`open_journal` picks by suffix).
- :class:`Guideline`: the versioned text S of MemCoE's update M(t+1) = T(M(t), h(t); S).
- :func:`~pgr_core.write.induction.induce` (``pgr guideline induce``): guideline induction from
  training examples (e.g. :func:`~pgr_core.write.examples.prefeval_examples`).
- :mod:`pgr_core.write.rewards` and :mod:`pgr_core.write.gmpo`: GMPO's rewards and its GRPO training
  entry point (``pip install 'pgr[train]'``).

>>> from pgr_core.write import Ingestor, Session, Turn  # doctest: +SKIP
>>> Ingestor(store).ingest([Session("s1", "2025-03-02", [Turn("user", "I hurt my knee")])],
...                        scope=Scope(user_id="u1"))  # doctest: +SKIP
"""

from __future__ import annotations

from pgr_core.write.consolidate import ConsolidationReport, Consolidator, Journal, SqliteJournal, open_journal
from pgr_core.write.examples import TrainingExample, prefeval_examples
from pgr_core.write.extract import ExtractedFact, Extraction, extract, parse_extraction
from pgr_core.write.guideline import DEFAULT_GUIDELINE, FACT_TYPES, Guideline, GuidelineError
from pgr_core.write.induction import InductionConfig, InductionResult, induce
from pgr_core.write.ingest import Ingestor, IngestReport, raw_facts
from pgr_core.write.ledger import Ledger, LedgerEntry
from pgr_core.write.sessions import Session, Turn, UserSessions, jsonl_sessions, locomo_sessions
from pgr_core.write.stores import FactWriter, WritableStore, writer_for

__all__ = [
    "ConsolidationReport",
    "Consolidator",
    "DEFAULT_GUIDELINE",
    "Extraction",
    "ExtractedFact",
    "FACT_TYPES",
    "FactWriter",
    "Guideline",
    "GuidelineError",
    "IngestReport",
    "InductionConfig",
    "InductionResult",
    "Ingestor",
    "Journal",
    "Ledger",
    "LedgerEntry",
    "Session",
    "SqliteJournal",
    "TrainingExample",
    "Turn",
    "UserSessions",
    "WritableStore",
    "extract",
    "induce",
    "jsonl_sessions",
    "locomo_sessions",
    "open_journal",
    "parse_extraction",
    "prefeval_examples",
    "raw_facts",
    "writer_for",
]
