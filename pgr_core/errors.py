"""The errors pgr raises, and the only ones.

    PGRError
    ├── InvalidArgumentError   bad arguments: empty query, K < 1, τ outside [0, 1], unknown strategy,
    │   │                      unparseable or naive/aware-mixed dates (also a ValueError)
    │   └── ScopeError         no scope, or a scope with none of user_id / agent_id / run_id
    ├── ConfigurationError     set-up that cannot work: no LLM where one is required, a missing extra,
    │   │                      an unknown plugin, a store file written by another embedder, a store
    │   │                      that cannot filter by scope (``Capabilities.scoped=False``)
    │   └── DamagedStoreError  a store's files lost facts it had acknowledged; ``pgr store repair``
    ├── StoreError             a store backend failed, or broke its contract (a partial batch, a hit
    │                          list longer than K, a fact outside the caller's scope); the backend's
    │                          exception, if any, is ``__cause__``
    └── LLMError               the LLM side failed (the policy degrades on these, never re-raises)
        ├── LLMTimeoutError
        ├── LLMConnectionError
        ├── LLMStatusError     an HTTP error status that survived the retries (``status_code``)
        └── LLMOutputError     the model answered, but not with what the schema asks for

Retrieval never raises ``LLMError`` or ``StoreError`` to the caller for a failure it can degrade
from: it returns what it has found so far and flags the trace. Configuration and argument errors
(a bad :class:`~pgr_core.types.Budget` included) are raised at once, before anything is searched or
written. Reaching a budget's cap is no error at all: pgr stops asking the LLM, returns what it has and
names the cap in ``trace.budget_hit``. :mod:`pgr_core.testing.faults` injects each failure; its
docstring holds the outcome of every one.
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "DamagedStoreError",
    "InvalidArgumentError",
    "LLMConnectionError",
    "LLMError",
    "LLMOutputError",
    "LLMStatusError",
    "LLMTimeoutError",
    "PGRError",
    "ScopeError",
    "StoreError",
]


class PGRError(Exception):
    """Base class of every error pgr raises."""


class InvalidArgumentError(PGRError, ValueError):
    """An argument is out of range or malformed; the message says which and what to pass."""


class ScopeError(InvalidArgumentError):
    """A store call without a usable scope. pgr never searches unscoped."""


class ConfigurationError(PGRError):
    """The set-up cannot work as given (missing LLM, missing extra, unknown plugin...)."""


class DamagedStoreError(ConfigurationError):
    """A store on disk holds fewer facts than it acknowledged (damaged files); it is not opened, and
    nothing in it is changed. ``missing`` lists the lost facts it can name, as (owner fields, fact id)
    tuples; :meth:`pgr_core.stores.edge.EdgeStore.repair` (``pgr store repair``) keeps every intact one."""

    def __init__(self, message: str, *, path: object = None, missing: list[tuple[object, ...]] | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.missing = list(missing or [])


class StoreError(PGRError):
    """A store backend failed. The original exception is attached as ``__cause__``."""


class LLMError(PGRError):
    """The LLM could not give a usable answer."""


class LLMTimeoutError(LLMError):
    """The LLM did not answer within the timeout."""


class LLMConnectionError(LLMError):
    """The LLM server could not be reached (refused connection, DNS, TLS...)."""


class LLMStatusError(LLMError):
    """The LLM server answered with an error status that retries did not clear."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class LLMOutputError(LLMError):
    """The LLM answered with text that is not the JSON the schema asks for."""

    def __init__(self, message: str, raw: str = "") -> None:
        super().__init__(message)
        self.raw = raw
