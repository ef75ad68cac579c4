"""The store hook φ(x; M, Θ): the only thing PGR asks of a memory store."""

from __future__ import annotations

import asyncio
import logging
import threading
import traceback
import uuid
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pgr_core._dates import DateLike, parse_date
from pgr_core.errors import ConfigurationError, InvalidArgumentError, StoreError
from pgr_core.types import Capabilities, Fact, Hit, Scope, SearchParams

__all__ = ["AddsOneFact", "ChangeListener", "Store", "validate_probes"]

#: Called after a write or deletion with the owners (scopes) of the facts that changed.
ChangeListener = Callable[[frozenset[Scope]], object]
_LISTENERS_LOCK = threading.Lock()  # guards the first creation of a store's listener list
log = logging.getLogger("pgr")


def validate_probes(probes: Sequence[str]) -> list[str]:
    if isinstance(probes, str):
        raise InvalidArgumentError("probes must be a sequence of strings, not one string: wrap it in a list")
    out = list(probes)
    for i, probe in enumerate(out):
        if not isinstance(probe, str) or not probe.strip():
            raise InvalidArgumentError(f"probe {i} must be a non-empty string, got {probe!r}")
    return out


class Store(ABC):
    """A memory store, seen through one batch search.

    Subclasses implement :meth:`search_batch`. The policy makes exactly one call per round with every
    probe of that round, so an adapter can embed all probes at once and make one search round trip.
    Declare what the store can do in ``capabilities``; override :meth:`asearch_batch` when the backend
    has a native async client (the default runs the sync method in a thread). Every other method pgr
    may call (``add_facts``, ``with_window``, ``facts_for``, ``vectors_for``, ``get``/``get_many``,
    ``delete``) is optional, and pgr calls it only where its :class:`~pgr_core.types.Capabilities`
    flag is declared (docs/stores.md, "The store contract").

    The policy reaches the hook only through ``_checked_search``, which holds the store to its contract:
    a scope on every call (``ScopeError`` without one), no search at all on a store whose
    ``capabilities.scoped`` is False (``ConfigurationError``), and a well-formed answer. A partial batch
    (fewer or more hit lists than probes), a list with more than ``top_k`` direct hits, anything that
    is not a list of :class:`Hit`, or a fact outside the caller's scope becomes a :class:`StoreError`,
    and the policy degrades: that round's hits are discarded, never half-used.

    A writable store reports its changes to listeners (:meth:`add_listener`) by calling
    :meth:`_notify` after each write or deletion; pgr's caches that hold per-scope results (the
    Phase-1 reuse cache) clear themselves there. A store that never notifies is still safe: those
    caches also expire their entries.
    """

    capabilities: ClassVar[Capabilities] = Capabilities()

    @abstractmethod
    def search_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        """Search once for every probe.

        Returns one list of hits per probe, in probe order. Each list holds at most ``params.top_k``
        direct hits scoring at least ``params.min_score``, best first, all owned by facts that
        ``scope`` allows; when ``params.window`` > 0 and ``capabilities.window`` is set, each direct hit
        is followed by its ±window same-session neighbours (``Hit.neighbour_of`` set). Backend failures
        raise :class:`~pgr_core.errors.StoreError` with the cause attached.

        Example::

            hits = store.search_batch(["knee injury", "evening schedule"],
                                      scope=Scope(user_id="u1"), params=SearchParams(top_k=5))
            hits[0][0].fact.text   # best fact for the first probe
        """

    async def asearch_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        """Async twin of :meth:`search_batch`."""
        return await asyncio.to_thread(self.search_batch, probes, scope=scope, params=params)

    # -- change notification
    def add_listener(self, callback: ChangeListener) -> None:
        """Call ``callback(scopes)`` after every write or deletion, with the scopes owning the facts that
        were added, replaced or removed. A bound method is held weakly (a PGR and its caches can be
        dropped without unregistering); any other callable is held until :meth:`remove_listener`.
        A listener that raises does not fail the write: the error is logged (logger ``pgr``) and the
        other listeners are still called. pgr's own cache listener never raises (it drops what it
        cannot match rather than keep it).
        """
        ref: Any
        try:
            ref = weakref.WeakMethod(callback)  # type: ignore[arg-type]
        except TypeError:  # a function, or a method of an object that takes no weak reference
            ref = callback
        with _LISTENERS_LOCK:
            listeners = self.__dict__.setdefault("_pgr_listeners", [])
            listeners.append(ref)

    def remove_listener(self, callback: ChangeListener) -> None:
        """Stop calling ``callback``; unknown callbacks are ignored."""
        with _LISTENERS_LOCK:
            listeners = self.__dict__.get("_pgr_listeners", [])
            listeners[:] = [r for r in listeners if _resolve(r) not in (None, callback)]

    def _notify(self, scopes: Iterable[Scope]) -> None:
        """Tell every listener that facts owned by ``scopes`` changed (subclasses call this after writing)."""
        owners = frozenset(scopes)
        if not owners:
            return
        with _LISTENERS_LOCK:
            listeners = self.__dict__.get("_pgr_listeners", [])
            live = [(r, _resolve(r)) for r in listeners]
            listeners[:] = [r for r, fn in live if fn is not None]
        for _, fn in live:
            if fn is not None:
                _tell(fn, owners, type(self).__name__)

    # -- what the policy calls: argument checks and error mapping around the hook
    def _precheck(self, probes: Sequence[str], scope: Scope) -> tuple[list[str], Scope]:
        probes = validate_probes(probes)
        scope = Scope.coerce(scope)  # ScopeError without one: pgr never searches unscoped
        if not self.capabilities.scoped:
            raise ConfigurationError(
                f"{type(self).__name__} declares that it cannot filter by scope (capabilities.scoped=False); "
                "pgr refuses to search it rather than search every tenant's memories. Give it a per-tenant "
                "index or scope metadata"
            )
        return probes, scope

    def _checked_search(self, probes: Sequence[str], scope: Scope, params: SearchParams) -> list[list[Hit]]:
        probes, scope = self._precheck(probes, scope)
        try:
            result = self.search_batch(probes, scope=scope, params=params)
        except (StoreError, InvalidArgumentError, ConfigurationError):
            raise
        except Exception as exc:
            raise StoreError(f"{type(self).__name__}.search_batch failed: {type(exc).__name__}: {exc}") from exc
        return self._checked_result(probes, scope, params, result)

    async def _achecked_search(self, probes: Sequence[str], scope: Scope, params: SearchParams) -> list[list[Hit]]:
        probes, scope = self._precheck(probes, scope)
        try:
            result = await self.asearch_batch(probes, scope=scope, params=params)
        except (StoreError, InvalidArgumentError, ConfigurationError):
            raise
        except Exception as exc:
            raise StoreError(f"{type(self).__name__}.asearch_batch failed: {type(exc).__name__}: {exc}") from exc
        return self._checked_result(probes, scope, params, result)

    def _checked_result(self, probes: list[str], scope: Scope, params: SearchParams, result: object) -> list[list[Hit]]:
        name = type(self).__name__
        if not isinstance(result, list | tuple):
            raise StoreError(f"{name} returned a {type(result).__name__}, not one list of hits per probe")
        if len(result) != len(probes):
            raise StoreError(f"{name} returned {len(result)} hit lists for {len(probes)} probes (a partial batch)")
        checked: list[list[Hit]] = []
        for i, hits in enumerate(result):
            if not isinstance(hits, list | tuple) or not all(_well_formed(h) for h in hits):
                raise StoreError(f"{name} returned something other than a list of Hit for probe {i}")
            direct = sum(1 for h in hits if h.neighbour_of is None)
            if direct > params.top_k:
                raise StoreError(f"{name} returned {direct} hits for probe {i}, more than top_k={params.top_k}")
            checked.append(list(hits))
        # A belt over the adapter's braces: a fact outside the caller's scope never leaves this method.
        leaked = [h for hits in checked for h in hits if not scope.allows(h.fact.scope)]
        if leaked:
            raise StoreError(
                f"{name} returned {len(leaked)} fact(s) outside scope {scope.as_dict()}; refusing to pass them on"
            )
        return checked


class AddsOneFact:
    """``add(text, scope=..., ...)`` for a store with ``add_facts``: one fact built from keywords."""

    if TYPE_CHECKING:  # each store writes its own way

        def add_facts(self, facts: Iterable[Fact], *, vectors: Any = None) -> list[str]: ...

    def add(
        self,
        text: str,
        *,
        scope: Scope | Mapping[str, str],
        date: DateLike | None = None,
        type: str | None = None,
        session_id: str | None = None,
        position: int | None = None,
        id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> str:
        """Store one fact and return its id (a fresh UUID unless ``id`` is given)."""
        fact = Fact(
            id=id or uuid.uuid4().hex,
            text=text,
            scope=Scope.coerce(scope),
            type=type,
            date=parse_date(date, what="date"),
            session_id=session_id,
            position=position,
            # a mapping is copied; anything else reaches check_fact as it is, and is refused there by name
            metadata=dict(metadata) if isinstance(metadata, Mapping) else ({} if metadata is None else metadata),
        )
        return self.add_facts([fact])[0]


def _tell(listener: ChangeListener, owners: frozenset[Scope], store: str) -> None:
    """Call one listener. Its failure must not undo or fail the write, nor pass unseen: it is logged,
    its traceback as text (a record holding the traceback would keep every listener's owner alive)."""
    try:
        listener(owners)
    except Exception:
        log.warning("a change listener of %s raised after a write: %r\n%s", store, listener, traceback.format_exc())


def _resolve(ref: Any) -> ChangeListener | None:
    return ref() if isinstance(ref, weakref.WeakMethod) else ref  # type: ignore[no-any-return]


def _well_formed(hit: object) -> bool:
    return isinstance(hit, Hit) and isinstance(hit.fact, Fact) and isinstance(hit.fact.scope, Scope)
