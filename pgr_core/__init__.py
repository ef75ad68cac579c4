"""pgr: Prospection-Guided Retrieval for the memory stores assistants already run.

>>> from pgr_core import PGR, Scope, InMemoryStore
>>> pgr = PGR(store)                                   # doctest: +SKIP
>>> result = pgr.retrieve("Should I join a soccer league this summer?",
...                       scope=Scope(user_id="u1"), date="2025-05-01")  # doctest: +SKIP
"""

from __future__ import annotations

from pgr_core.anticipation.anticipating import Anticipating
from pgr_core.anticipation.cues import CueCache, CueWriter
from pgr_core.errors import (
    ConfigurationError,
    DamagedStoreError,
    InvalidArgumentError,
    LLMConnectionError,
    LLMError,
    LLMOutputError,
    LLMStatusError,
    LLMTimeoutError,
    PGRError,
    ScopeError,
    StoreError,
)
from pgr_core.models.embedders import Embedder, HashingEmbedder, MiniLMEmbedder, default_embedder
from pgr_core.models.llm import LLM, Completion, OpenAICompatible, llm_from_env
from pgr_core.observability.trace import DroppedProbe, FoundFact, Probe, RetrievalResult, Round, Step, Trace, Usage
from pgr_core.policy.hygiene import Hygiene
from pgr_core.policy.pgr import PGR, Answer, PGRConfig
from pgr_core.policy.prospectors import (
    DIMENSIONS,
    FeedbackProspector,
    LLMProspector,
    NoProspection,
    Prospection,
    Prospector,
)
from pgr_core.stores.contract import Store
from pgr_core.stores.edge import EdgeStore
from pgr_core.stores.memory import InMemoryStore
from pgr_core.types import Budget, Capabilities, Fact, Hit, Scope, SearchParams

__version__ = "0.1.0"

__all__ = [
    "Answer",
    "Anticipating",
    "Budget",
    "Capabilities",
    "Completion",
    "ConfigurationError",
    "CueCache",
    "CueWriter",
    "DIMENSIONS",
    "DamagedStoreError",
    "DroppedProbe",
    "EdgeStore",
    "Embedder",
    "Fact",
    "FeedbackProspector",
    "FoundFact",
    "HashingEmbedder",
    "Hit",
    "Hygiene",
    "InMemoryStore",
    "InvalidArgumentError",
    "LLM",
    "LLMConnectionError",
    "LLMError",
    "LLMOutputError",
    "LLMProspector",
    "LLMStatusError",
    "LLMTimeoutError",
    "MiniLMEmbedder",
    "NoProspection",
    "OpenAICompatible",
    "PGR",
    "PGRConfig",
    "PGRError",
    "Probe",
    "Prospection",
    "Prospector",
    "RetrievalResult",
    "Round",
    "Scope",
    "ScopeError",
    "SearchParams",
    "Step",
    "Store",
    "StoreError",
    "Trace",
    "Usage",
    "default_embedder",
    "llm_from_env",
]
