"""Writing facts through a store: the small protocol the write side needs, and a wrapper over it.

A store is writable when it has ``add_facts(facts) -> ids`` (:class:`~pgr_core.InMemoryStore`,
``pgr_adapters.mem0.Mem0Store``) or ``upsert_facts(facts) -> ids`` (``pgr_adapters.qdrant.QdrantStore``).
Ingestion needs only that. Consolidation also needs ``delete(ids)`` and a way to list a scope's facts
(``facts``), and ids that survive the write (a store that makes up its own ids, as mem0 does, cannot
replace a fact in place). :class:`FactWriter` says which of these a store has and names what is missing:
a pgr :class:`~pgr_core.stores.contract.Store` by what it declares (``Capabilities.writable``, ``deletes``,
``lists``, ``by_id``), any other object by the methods it has.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import numpy as np

from pgr_core._dates import parse_date
from pgr_core.errors import ConfigurationError, InvalidArgumentError, StoreError
from pgr_core.models.embedders import Embedder
from pgr_core.types import Capabilities, Fact, Scope

__all__ = ["FactWriter", "WritableStore", "fact_from_dict", "latest_date", "writer_for"]


@runtime_checkable
class WritableStore(Protocol):
    """A store facts can be written into. ``add_facts`` stores them (replacing any fact with the same
    id) and returns their ids in order."""

    def add_facts(self, facts: Sequence[Fact]) -> list[str]: ...


class FactWriter:
    """The write operations of one store, with clear errors for missing ones: those a pgr store declares
    in its ``capabilities`` (``writable``, ``deletes``, ``lists``, ``by_id``), or for any other object
    (a plain class with ``add_facts``), the methods it has.

    - ``put(facts)``: ``add_facts`` or ``upsert_facts``.
    - ``remove(ids, scope=)``: ``delete(ids, scope=scope)`` (a store whose ``delete`` takes no scope
      gets only ids that ``scope``'s listing holds, so an id never reaches another owner's fact).
    - ``get(id, scope=)``: the store's ``get``, never a fact outside ``scope``.
    - ``facts_of(scope)``: every fact ``scope`` sees (the store's ``facts_for(scope)``, else its
      ``facts`` listing, filtered).
    - ``keeps_ids``: a fact written with id X can be found and replaced as X (False for mem0).
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        caps = getattr(store, "capabilities", None)
        # what a pgr store declares; None for an object outside the store contract (its methods count)
        self._declared: Capabilities | None = caps if isinstance(caps, Capabilities) else None
        put = getattr(store, "add_facts", None) or getattr(store, "upsert_facts", None)
        if self._declared is not None and not self._declared.writable:
            put = None
        if not callable(put):
            raise ConfigurationError(
                f"{type(store).__name__} cannot be written to: the write side needs a store that declares "
                "capabilities.writable, with add_facts(facts) or upsert_facts(facts) (InMemoryStore, "
                "QdrantStore, Mem0Store)"
            )
        self._put = put
        self.name = type(store).__name__
        # mem0 makes its own ids on add: an update cannot keep the fact's id there (wrapped or not)
        inner = getattr(store, "store", None) if self.name == "Anticipating" else store
        self.keeps_ids = type(inner).__name__ != "Mem0Store"

    @property
    def embedder(self) -> Embedder | None:
        return getattr(self.store, "embedder", None)

    def put(self, facts: Sequence[Fact]) -> list[str]:
        batch = list(facts)
        if not batch:
            return []
        try:
            return list(self._put(batch))
        except (StoreError, ConfigurationError):
            raise
        except Exception as exc:
            raise StoreError(f"{self.name} failed to write {len(batch)} fact(s): {type(exc).__name__}: {exc}") from exc

    def _can(self, flag: str, method: str) -> bool:
        """Whether the store declares ``flag`` (a pgr store), or has ``method`` (any other object)."""
        if self._declared is not None:
            return bool(getattr(self._declared, flag))
        return callable(getattr(self.store, method, None))

    @property
    def can_remove(self) -> bool:
        return self._can("deletes", "delete")

    @property
    def can_list(self) -> bool:
        return self._can("lists", "facts_for") or hasattr(self.store, "facts")

    def require_rewrite(self, what: str) -> None:
        """Raise unless the store can list, replace and delete facts by id (``what`` needs it)."""
        missing = [
            name
            for name, ok in (
                ("delete(ids) (capabilities.deletes)", self.can_remove),
                ("a facts listing (capabilities.lists: facts_for)", self.can_list),
                ("stable ids", self.keeps_ids),
            )
            if not ok
        ]
        if missing:
            raise ConfigurationError(
                f"{what} needs a store that can replace and delete facts by id; {self.name} lacks "
                f"{', '.join(missing)}. Consolidate in an InMemoryStore, or in the framework's own tools"
            )

    def remove(self, ids: Iterable[str], *, scope: Scope) -> int:
        """Delete the facts ``ids`` that ``scope`` sees; returns how many went."""
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return 0
        if not self.can_remove:
            raise ConfigurationError(
                f"{self.name} has no delete(ids) (capabilities.deletes): facts cannot be removed from it"
            )
        delete = self.store.delete
        try:
            if _takes_scope(delete):
                return int(delete(wanted, scope=scope) or 0)
            mine = {f.id for f in self.facts_of(scope)}
            wanted = [i for i in wanted if i in mine]
            return int(delete(wanted) or 0) if wanted else 0
        except (StoreError, ConfigurationError, InvalidArgumentError):
            raise
        except Exception as exc:
            raise StoreError(f"{self.name} failed to delete {len(wanted)} fact(s): {exc}") from exc

    def get(self, fact_id: str, *, scope: Scope) -> Fact | None:
        if not self._can("by_id", "get"):
            return None
        getter = self.store.get
        fact = getter(fact_id, scope=scope) if _takes_scope(getter) else getter(fact_id)
        return fact if isinstance(fact, Fact) and scope.allows(fact.scope) else None

    def facts_of(self, scope: Scope) -> list[Fact]:
        if self._can("lists", "facts_for"):
            return [f for f in self.store.facts_for(scope) if scope.allows(f.scope)]
        if not hasattr(self.store, "facts"):
            raise ConfigurationError(f"{self.name} cannot list its facts")
        return [f for f in self.store.facts if scope.allows(f.scope)]

    def embed(self, texts: Sequence[str], embedder: Embedder | None = None) -> np.ndarray:
        model = embedder or self.embedder
        if model is None:
            raise ConfigurationError(f"{self.name} has no embedder: pass embedder=... to compare facts")
        return model.embed(list(texts)) if texts else np.zeros((0, model.dim), np.float32)


def _takes_scope(method: Any) -> bool:
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "scope" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def writer_for(store: Any) -> FactWriter:
    """The :class:`FactWriter` of ``store`` (a ConfigurationError says what a read-only store lacks)."""
    return store if isinstance(store, FactWriter) else FactWriter(store)


# --------------------------------------------------------------------------- (de)serialising facts


def fact_from_dict(data: Mapping[str, Any]) -> Fact:
    """The inverse of :meth:`Fact.to_dict` (for the journal and the ledger)."""
    return Fact(
        id=str(data["id"]),
        text=str(data["text"]),
        scope=Scope(**data["scope"]),
        type=data.get("type"),
        date=parse_date(data.get("date")),
        updated_at=parse_date(data.get("updated_at")),
        session_id=data.get("session_id"),
        position=data.get("position"),
        metadata=dict(data.get("metadata") or {}),
    )


def latest_date(fact: Fact) -> datetime | None:
    """When the fact was last said or confirmed: ``updated_at``, else ``date``."""
    return fact.updated_at or fact.date
