"""Evaluation: data sets, metrics, the compared methods, a resumable runner and its report.

``pgr eval locomo --data ../shared/data/locomo --methods query-only,pgr-feedback --limit 50 --json out.json``
is the command-line face of :func:`run_eval` + :func:`summarise` + :func:`write_report`.
"""

from __future__ import annotations

from pgr_core.evaluation.cache import CachedLLM, request_key
from pgr_core.evaluation.data import EvalQuestion, EvalSet, load_jsonl, load_locomo_set, load_prefeval, load_set
from pgr_core.evaluation.methods import METHODS, make_method, parse_method
from pgr_core.evaluation.metrics import judged_recall, recall, recall_at, recall_exact, win_rate
from pgr_core.evaluation.output import markdown, write_chart, write_report
from pgr_core.evaluation.runner import BUDGETS, run_eval, summarise

__all__ = [
    "BUDGETS",
    "METHODS",
    "CachedLLM",
    "EvalQuestion",
    "EvalSet",
    "judged_recall",
    "load_jsonl",
    "load_locomo_set",
    "load_prefeval",
    "load_set",
    "make_method",
    "markdown",
    "parse_method",
    "recall",
    "recall_at",
    "recall_exact",
    "request_key",
    "run_eval",
    "summarise",
    "win_rate",
    "write_chart",
    "write_report",
]
