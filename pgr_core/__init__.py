"""pgr: Prospection-Guided Retrieval for the memory stores assistants already run.

>>> from pgr_core import PGR, Scope, InMemoryStore
>>> pgr = PGR(store)                                   # doctest: +SKIP
>>> result = pgr.retrieve("Should I join a soccer league this summer?",
...                       scope=Scope(user_id="u1"), date="2025-05-01")  # doctest: +SKIP
"""

from __future__ import annotations

from .anticipating import Anticipating
from .cues import CueCache, CueWriter
from .edge import EdgeStore
from .embedders import Embedder, HashingEmbedder, MiniLMEmbedder, default_embedder
from .errors import (
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
from .hygiene import Hygiene
from .llm import LLM, Completion, OpenAICompatible, llm_from_env
from .memory import InMemoryStore
from .policy import PGR, Answer, PGRConfig
from .prospectors import (
    DIMENSIONS,
    FeedbackProspector,
    LLMProspector,
    NoProspection,
    Prospection,
    Prospector,
)
from .store import Store
from .trace import DroppedProbe, FoundFact, Probe, RetrievalResult, Round, Step, Trace, Usage
from .types import Budget, Capabilities, Fact, Hit, Scope, SearchParams

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
