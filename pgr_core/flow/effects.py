"""The things the retrieval flow asks the outside world for: store searches, LLM calls, and how typical
of a scope's memory some facts are (for centred scores, :mod:`pgr_core.policy.centring`).

The policy and the prospectors are written as generators that ``yield`` these effects and receive
their results, so one flow serves both the sync and the async API (no duplicated logic): the driver
in :mod:`pgr_core.flow.drivers` performs each effect with blocking or awaitable calls.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pgr_core.observability.trace import Round, Trace
from pgr_core.types import Fact, Scope, SearchParams


@dataclass(frozen=True)
class Search:
    """One store call: every probe of a round at once."""

    probes: Sequence[str]
    params: SearchParams
    scope: Scope  # every store call carries the caller's scope
    round: Round | None = None  # the trace round it serves: telemetry reads its phase, index and Δ


@dataclass(frozen=True)
class Ask:
    """One LLM call, billed to ``phase`` in the trace."""

    phase: str
    messages: Sequence[Mapping[str, str]]
    schema: Mapping[str, Any] | None
    max_tokens: int
    trace: Trace  # where the call's usage is billed


@dataclass(frozen=True)
class Typicality:
    """Each fact's mean cosine to the facts of ``scope`` (:meth:`pgr_core.policy.centring.MemoryCentre.typicality`)."""

    facts: Sequence[Fact]  # a round's distinct direct hits
    scope: Scope  # the memory a fact is compared with is the caller's own


Effect = Search | Ask | Typicality
Flow = Generator[Effect, Any, Any]
