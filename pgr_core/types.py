"""The small value types every part of pgr speaks: scope, facts, hits, retrieval parameters Θ."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import numpy as np

from pgr_core.errors import ConfigurationError, InvalidArgumentError, ScopeError

__all__ = ["CAPABILITY_METHODS", "Budget", "Capabilities", "Fact", "Hit", "Scope", "SearchParams", "owner_fields"]


@dataclass(frozen=True)
class Scope:
    """Whose memories a call may see: every set field must match (mem0's user/agent/run model).

    At least one field must be set; pgr refuses to search without a scope.

    >>> Scope(user_id="u1").allows(Scope(user_id="u1", run_id="r9"))
    True
    """

    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None

    def __post_init__(self) -> None:
        for name in ("user_id", "agent_id", "run_id"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ScopeError(f"Scope.{name} must be a non-empty string or None, got {value!r}")
        if self.user_id is None and self.agent_id is None and self.run_id is None:
            raise ScopeError("a Scope needs at least one of user_id, agent_id or run_id")

    def allows(self, owner: Scope) -> bool:
        """True when a fact owned by ``owner`` is visible to a caller holding this scope."""
        return all(
            mine is None or mine == theirs
            for mine, theirs in (
                (self.user_id, owner.user_id),
                (self.agent_id, owner.agent_id),
                (self.run_id, owner.run_id),
            )
        )

    def as_dict(self) -> dict[str, str]:
        """The set fields only, e.g. ``{"user_id": "u1"}`` (the shape of mem0's filters)."""
        return {
            k: v
            for k, v in (("user_id", self.user_id), ("agent_id", self.agent_id), ("run_id", self.run_id))
            if v is not None
        }

    @classmethod
    def coerce(cls, value: Scope | Mapping[str, str] | None) -> Scope:
        if isinstance(value, Scope):
            return value
        if value is None:
            raise ScopeError("scope is required: pass scope=Scope(user_id=...) (pgr never searches unscoped)")
        if isinstance(value, Mapping):
            unknown = set(value) - {"user_id", "agent_id", "run_id"}
            if unknown:
                raise ScopeError(f"unknown scope keys {sorted(unknown)}; use user_id, agent_id, run_id")
            return cls(**value)
        raise ScopeError(f"scope must be a Scope or a mapping, not {type(value).__name__}")


def owner_fields(source: Mapping[str, Any], keys: Mapping[str, str]) -> dict[str, str] | None:
    """The scope fields a stored record names as its owner, read from ``source`` through ``keys``
    (scope field -> the record's key): each a plain string, a blank one naming nothing. ``None`` when a
    field is named ambiguously (a list, a number, a mapping: a keyword filter may match a list by any
    element, so such a record would answer to several owners). Adapters build the owner Scope from it.

    >>> owner_fields({"uid": "alice", "agent": ""}, {"user_id": "uid", "agent_id": "agent"})
    {'user_id': 'alice'}
    >>> owner_fields({"uid": ["alice", "bob"]}, {"user_id": "uid"}) is None
    True
    """
    owner: dict[str, str] = {}
    for name, key in keys.items():
        value = source.get(key)
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        if not isinstance(value, str):
            return None
        owner[name] = value
    return owner


SESSION_KEY = "pgr_session"
"""Fact metadata: the session that wrote a fact (an update keeps the writer's); ingestion sets it."""


def fact_key(fact_id: str, owner: Scope) -> str:
    """What tells a fact apart within any one caller's scope: its id when a user alone owns it, else its id
    and owner. Two agents (or runs) of one user may each hold a fact ``"f1"``: under the user's scope
    those are two facts, ``"f1@u1/planner/"`` and ``"f1@u1/coach/"``.

    >>> fact_key("f1", Scope(user_id="u1")), fact_key("f1", Scope(user_id="u1", agent_id="planner"))
    ('f1', 'f1@u1/planner/')
    """
    if owner.agent_id is None and owner.run_id is None:
        return fact_id
    return f"{fact_id}@{owner.user_id or ''}/{owner.agent_id or ''}/{owner.run_id or ''}"


@dataclass(frozen=True)
class Fact:
    """One memory: a short text with its owner, type and dates.

    ``session_id`` and ``position`` place a conversation turn in its session so a temporal window can
    bring its neighbours; stores that do not keep turn order leave them ``None``.
    """

    id: str
    text: str
    scope: Scope
    type: str | None = None
    date: datetime | None = None  # when it was said or happened
    updated_at: datetime | None = None
    session_id: str | None = None
    position: int | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """The fact's id, and its owner where one user's agents or runs may share the id (:func:`fact_key`)."""
        return fact_key(self.id, self.scope)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "text": self.text,
            "scope": self.scope.as_dict(),
            "type": self.type,
            "date": self.date.isoformat() if self.date else None,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
            "session_id": self.session_id,
            "position": self.position,
            "metadata": dict(self.metadata),
        }


@dataclass(frozen=True)
class Hit:
    """A fact returned for one probe. ``neighbour_of`` is set when it came in through the window;
    ``cue`` is the cue that scored it, when its cue beat its own text (:class:`~pgr_core.Anticipating`);
    ``raw`` is the similarity behind ``score`` before centring, where the store centres its own scores
    (``Anticipating(scoring="centred")``: the fact's own cosine plus its best cue's), so a window
    neighbour can step down from it as from a cosine."""

    fact: Fact
    score: float
    rank: int
    neighbour_of: str | None = None
    cue: str | None = None
    raw: float | None = None

    @property
    def key(self) -> str:
        """Its fact's :attr:`Fact.key`."""
        return self.fact.key

    @property
    def anchor(self) -> str | None:
        """The key of the hit whose window brought it (``neighbour_of``, of the same owner), or None."""
        return None if self.neighbour_of is None else fact_key(self.neighbour_of, self.fact.scope)


@dataclass(frozen=True)
class SearchParams:
    """Θ, the retrieval parameters of one store call.

    - ``top_k``: hits per probe (the paper: 5 per probe, 20 for query-only).
    - ``min_score``: the similarity floor τ; hits scoring below it are dropped.
    - ``window``: temporal window w; each hit brings the ±w turns around it in its session, for stores
      that keep turn order (``Capabilities.window``). Neighbours count toward the returned budget.
    """

    top_k: int = 5
    min_score: float = 0.3
    window: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            raise InvalidArgumentError(f"top_k (K) must be an integer >= 1, got {self.top_k!r}")
        if (
            isinstance(self.min_score, bool)
            or not isinstance(self.min_score, int | float)
            or math.isnan(self.min_score)
            or not 0.0 <= self.min_score <= 1.0
        ):
            raise InvalidArgumentError(f"min_score (τ) must be a number in [0, 1], got {self.min_score!r}")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
            raise InvalidArgumentError(f"window must be an integer >= 0, got {self.window!r}")

    def with_(self, **changes: Any) -> SearchParams:
        return replace(self, **changes)


@dataclass(frozen=True)
class Capabilities:
    """What a store can do, declared once; the policy and the conformance suite read it.

    Every store implements ``search_batch``. A flag set here promises the method beside it, and pgr
    asks a store for an optional method only where its flag is set (never by looking for the method):

    - ``writable``: facts can be written, ``add_facts(facts)`` (``upsert_facts`` on a QdrantStore).
    - ``window``: keeps session and position (``SearchParams.window``), and ``with_window(hits, scope=, window=)``.
    - ``lists``: ``facts_for(scope)`` gives every fact ``scope`` allows.
    - ``vectors``: ``vectors_for(ids, scope=)`` gives the stored unit vectors of those facts, a row each.
    - ``by_id``: ``get(id, scope=)`` and ``get_many(ids, scope=)`` fetch facts by id, within the scope.
    - ``deletes``: ``delete(ids, scope=)`` removes those of the facts ``scope`` allows, returning how many.

    The conformance suite (:mod:`pgr_core.testing.conformance`) checks that each declared flag's
    method is there and works, and skips the tests that need an ability a store does not declare.
    """

    writable: bool = False
    dates: bool = False  # facts come back with their dates
    cosine_scores: bool = False  # scores are cosine similarities in [-1, 1], so τ means what it says
    window: bool = False  # keeps session and position, so SearchParams.window works (and with_window)
    native_async: bool = False
    # Every search is filtered by the caller's scope in the backend itself. A store that cannot do that
    # (a shared index without owner metadata) declares False, and pgr refuses to search it at all
    # rather than search unscoped (ConfigurationError when PGR is built or a search is made).
    scoped: bool = True
    lists: bool = False  # facts_for(scope)
    vectors: bool = False  # vectors_for(ids, scope=)
    by_id: bool = False  # get(id, scope=) and get_many(ids, scope=)
    deletes: bool = False  # delete(ids, scope=)

    def require(self, flag: str, store: object, needed_for: str) -> None:
        """Raise :class:`~pgr_core.errors.ConfigurationError` unless ``flag`` is declared, naming the
        flag, its method and what needed it (``store`` names the store by its type)."""
        if not getattr(self, flag):
            raise ConfigurationError(
                f"{type(store).__name__} does not declare capabilities.{flag} "
                f"({CAPABILITY_METHODS[flag]}), which {needed_for}"
            )


#: A store that keeps everything pgr can use: pgr's own (InMemoryStore, EdgeStore).
EVERY_ABILITY = Capabilities(
    writable=True, dates=True, cosine_scores=True, window=True, lists=True, vectors=True, by_id=True, deletes=True
)


#: The method each optional :class:`Capabilities` flag promises (what a store declaring it implements).
CAPABILITY_METHODS: dict[str, str] = {
    "writable": "add_facts(facts)",
    "window": "with_window(hits, scope=, window=)",
    "lists": "facts_for(scope)",
    "vectors": "vectors_for(ids, scope=)",
    "by_id": "get(id, scope=) and get_many(ids, scope=)",
    "deletes": "delete(ids, scope=)",
}


@dataclass(frozen=True)
class Budget:
    """Caps on what one retrieval (or answer) may spend; ``None`` leaves a cap off.

    - ``max_llm_calls``: LLM calls, repair retries and failed calls included (0: never ask the LLM).
    - ``max_tokens``: prompt + completion tokens. A call starts only when the tokens spent so far, its
      prompt (estimated as characters / 4) and its own ``max_tokens`` all fit, so the cap holds up to
      the error of that estimate.
    - ``deadline_s``: seconds from the start of the call, checked before every LLM call and every
      Phase-2 round. A call in flight gets the time left as its timeout (clients whose
      ``accepts_timeout`` is set) or is abandoned when the time runs out.

    When a cap is reached pgr stops asking the LLM and returns what it has, at least the query's own
    hits (the query is always probed). ``trace.budget_hit`` names the cap (``"budget_llm_calls"``,
    ``"budget_tokens"`` or ``"deadline"``), and so does ``trace.stop_reason`` when it cut the rounds short.
    A per-call budget can only tighten the instance's: each cap is the smaller of the two.

    >>> Budget(max_llm_calls=3, deadline_s=2.5).tightened(Budget(max_llm_calls=5, max_tokens=4000))
    Budget(max_llm_calls=3, max_tokens=4000, deadline_s=2.5)
    """

    max_llm_calls: int | None = None
    max_tokens: int | None = None
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_llm_calls", "max_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise InvalidArgumentError(f"Budget.{name} must be None or an integer >= 0, got {value!r}")
        d = self.deadline_s
        if d is not None and (
            isinstance(d, bool) or not isinstance(d, int | float) or math.isnan(d) or math.isinf(d) or d <= 0
        ):
            raise InvalidArgumentError(f"Budget.deadline_s must be None or a finite number of seconds > 0, got {d!r}")

    @property
    def unlimited(self) -> bool:
        return self.max_llm_calls is None and self.max_tokens is None and self.deadline_s is None

    def tightened(self, other: Budget | None) -> Budget:
        """Each cap the smaller of this budget's and ``other``'s (a missing cap loses to a set one)."""
        if other is None:
            return self

        def least(a: Any, b: Any) -> Any:
            return b if a is None else a if b is None else min(a, b)

        return Budget(
            least(self.max_llm_calls, other.max_llm_calls),
            least(self.max_tokens, other.max_tokens),
            least(self.deadline_s, other.deadline_s),
        )

    def as_dict(self) -> dict[str, float]:
        """The caps that are set, e.g. ``{"max_llm_calls": 3}``."""
        return {k: v for k, v in self.__dict__.items() if v is not None}

    @classmethod
    def coerce(cls, value: Budget | Mapping[str, Any] | None, *, what: str = "budget") -> Budget | None:
        if value is None or isinstance(value, Budget):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - {"max_llm_calls", "max_tokens", "deadline_s"}
            if unknown:
                raise InvalidArgumentError(
                    f"unknown {what} key(s) {sorted(unknown)}; use max_llm_calls, max_tokens, deadline_s"
                )
            return cls(**value)
        raise InvalidArgumentError(f"{what} must be a Budget (or a mapping of its fields), not {type(value).__name__}")


@runtime_checkable
class Embedder(Protocol):
    """Anything with a ``name``, a ``dim`` and ``embed(texts) -> (len(texts), dim)`` unit rows."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...
