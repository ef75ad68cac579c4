"""Scores centred on the user's memory: a fact that resembles everything the user says stops crowding
out the one fact that matters.

An under-specified request ("any ideas for the weekend?") sits close to the middle of a person's memory
in embedding space, so the facts that come first by cosine are the *typical* ones, each a little like
everything (the same hobby mentioned twenty times), while the fact that changes the answer (a knee
operation, a sold car) is specific and sits further out. pgr centres every probe's scores on the memory
of the scope it searches:

    centred(probe, f) = cos(probe, f) - w x typicality(f),   typicality(f) = f . mean of the scope's facts

``typicality(f)`` is the mean cosine of ``f`` to the scope's facts (unit vectors; ``f`` itself included),
so this is a probe vector shifted away from the scope's centre: no LLM, one mean vector per scope. It is
the hubness correction of cross-lingual retrieval (Conneau et al.'s CSLS, with the whole memory as the
neighbourhood) applied to one person's memory. The floor τ still reads the store's own cosine; the order
and the cut to K read the centred score, over a deeper candidate list (``PGRConfig.centring_depth``).

Measured with MiniLM, no LLM, the question's own list at 20 facts (lab/RESULTS.md): MQ-lite
facts 0.355 -> 0.400 at w = 1, turns 0.237 -> 0.319; LoCoMo 0.521 -> 0.550; PrefEval 0.970 -> 0.990.

:class:`MemoryCentre` keeps one mean vector per scope, built from the store's own vectors
(``vectors_for``) or, for a store that has none to give, from its embedder over ``facts_for``, and
dropped as soon as the store reports a write in that scope.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from pgr_core.models.embedders import unit_rows
from pgr_core.types import Fact, Hit, Scope

if TYPE_CHECKING:
    from pgr_core.models.embedders import Embedder
    from pgr_core.stores.contract import Store

__all__ = [
    "CentringUnavailable",
    "MemoryCentre",
    "PerScope",
    "centrable",
    "centred",
    "read_vectors",
]

T = TypeVar("T")

_MAX_EMBEDDED = 2000  # a store that gives no vectors: the mean of an even sample of at most this many facts


class CentringUnavailable(Exception):
    """The store cannot give what centring needs (its facts' vectors, or a list of a scope's facts)."""


@dataclass(frozen=True)
class _Centre:
    """One scope's mean, and the typicality of every fact it was built from (read once, with it)."""

    mean: np.ndarray | None  # None: the store lists no fact for the scope
    typical: dict[str, float]


def centrable(store: Store, embedder: Any = None) -> bool:
    """Whether a :class:`MemoryCentre` over ``store`` can build a scope's mean: the store lists a
    scope's facts (``capabilities.lists``: ``facts_for``) and gives their vectors (``capabilities.vectors``:
    ``vectors_for``), or ``embedder`` embeds them."""
    caps = store.capabilities
    return caps.lists and (caps.vectors or embedder is not None)


class PerScope(Generic[T]):
    """One value per scope, built on first use and dropped when a store reports a write in that scope
    (:meth:`invalidate` is a store listener). Thread-safe; a value whose build started before a write
    is returned but not kept; a build that raises keeps nothing. At most ``max_scopes`` are kept, least
    recently used first out."""

    def __init__(self, max_scopes: int = 256) -> None:
        self.max_scopes = max_scopes
        self._held: OrderedDict[Scope, T] = OrderedDict()
        self._generation = 0
        self._lock = threading.Lock()

    def invalidate(self, scopes: Collection[Scope] | None = None) -> None:
        """Forget every scope that can see a fact owned by ``scopes`` (all of them when None, or when an
        owner cannot be matched). Never raises."""
        with self._lock:
            self._generation += 1  # a value being built now is not kept: what it read may be stale
            try:
                owners = None if scopes is None else list(scopes)
                stale = [s for s in self._held if owners is None or any(s.allows(o) for o in owners)]
            except Exception:
                stale = list(self._held)
            for scope in stale:
                del self._held[scope]

    def get(self, scope: Scope, build: Callable[[Scope], T]) -> T:
        """``scope``'s value, built by ``build(scope)`` when not held."""
        with self._lock:
            if scope in self._held:
                self._held.move_to_end(scope)
                return self._held[scope]
            generation = self._generation
        value = build(scope)
        with self._lock:
            if self._generation == generation:  # no write meanwhile: keep it
                self._held[scope] = value
                while len(self._held) > self.max_scopes:
                    self._held.popitem(last=False)
        return value


class MemoryCentre:
    """The mean unit vector of each scope's facts, and each fact's typicality against it.

    The typicality of every fact the mean was built from is kept with it, so a round's hits are looked
    up, not read again from the store; only a fact the mean did not see (one left out of the sample) is.
    Thread-safe; a scope's centre is rebuilt after the store reports a write there (a build that started
    before the write is not kept). At most ``max_scopes`` are kept, least recently used first out.

    """

    def __init__(
        self,
        store: Store,
        embedder: Embedder | None,
        *,
        max_scopes: int = 256,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.max_scopes = max_scopes
        self._centres: PerScope[_Centre] = PerScope(max_scopes)
        store.add_listener(self.invalidate)  # held weakly: dropping the PGR drops this

    def invalidate(self, scopes: Collection[Scope] | None = None) -> None:
        """Store listener: forget the mean of every scope that can see a fact owned by ``scopes`` (all of
        them when None, or when an owner cannot be matched). Never raises."""
        self._centres.invalidate(scopes)

    def typicality(self, scope: Scope, facts: Sequence[Fact]) -> dict[str, float]:
        """fact key (:attr:`Fact.key`) -> its mean cosine to ``scope``'s facts. Raises
        :class:`CentringUnavailable`."""
        if not facts:
            return {}
        keys = [f.key for f in facts]
        centre = self._centre(scope)
        if centre.mean is None:  # the store lists no fact for the scope: nothing is typical of it
            return dict.fromkeys(keys, 0.0)
        out = {key: centre.typical[key] for key in keys if key in centre.typical}
        unseen = [at for at, key in enumerate(keys) if key not in out]
        if unseen:
            ids = [keys[at] for at in unseen]
            vectors = self._vectors(scope, [facts[at] for at in unseen])
            out.update(zip(ids, (float(v) for v in vectors @ centre.mean), strict=True))
        return out

    def typicality_of_hits(self, scope: Scope, hit_lists: Sequence[Sequence[Hit]]) -> dict[str, float]:
        """:meth:`typicality` of a round's distinct direct hits."""
        return self.typicality(scope, distinct_hits(hit_lists))

    # ------------------------------------------------------------------ internals

    def _centre(self, scope: Scope) -> _Centre:
        return self._centres.get(scope, self._build)

    def _build(self, scope: Scope) -> _Centre:
        caps = self.store.capabilities
        if not caps.lists:
            raise CentringUnavailable(
                f"{type(self.store).__name__} cannot list a scope's facts (no capabilities.lists: facts_for)"
            )
        facts = list(self.store.facts_for(scope))  # type: ignore[attr-defined]
        centre = _Centre(None, {})
        if facts:
            if not caps.vectors and len(facts) > _MAX_EMBEDDED:
                step = len(facts) / _MAX_EMBEDDED
                facts = [facts[int(i * step)] for i in range(_MAX_EMBEDDED)]
            vectors = self._vectors(scope, facts)
            mean = vectors.mean(axis=0)
            centre = _Centre(mean, {f.key: float(v) for f, v in zip(facts, vectors @ mean, strict=True)})
        return centre

    def _vectors(self, scope: Scope, facts: Sequence[Fact]) -> np.ndarray:
        return read_vectors(self.store, self.embedder, scope, facts)


def read_vectors(store: Store, embedder: Embedder | None, scope: Scope, facts: Sequence[Fact]) -> np.ndarray:
    """Unit vectors of ``facts``, seen from ``scope``: the store's own (``vectors_for``, asked owner by
    owner: two agents of one user may hold the same id) where it declares ``capabilities.vectors``, else
    ``embedder``'s over their texts. Raises :class:`CentringUnavailable` when neither can."""
    texts = [f.text for f in facts]
    if store.capabilities.vectors and facts:
        own = store.vectors_for  # type: ignore[attr-defined]
        rows: dict[Scope, list[int]] = {}
        for at, fact in enumerate(facts):
            rows.setdefault(fact.scope if scope.allows(fact.scope) else scope, []).append(at)
        try:
            parts = [(at, np.asarray(own([facts[i].id for i in at], scope=owner))) for owner, at in rows.items()]
            out = np.zeros((len(facts), parts[0][1].shape[1]), dtype=np.float32)
            for at, part in parts:
                out[at] = part
            return unit_rows(out)
        except KeyError:
            pass  # a fact written meanwhile, or one the store resolves differently: embed instead
    if embedder is None:
        raise CentringUnavailable(
            f"{type(store).__name__} gives no vectors (no capabilities.vectors: vectors_for) and no embedder "
            "was given: pass PGR(..., embedder=...) or centring=None"
        )
    return unit_rows(embedder.embed(texts))


def centred(
    hits: Sequence[Hit], typicality: Mapping[str, float], weight: float, top_k: int, min_score: float
) -> list[Hit]:
    """One probe's deep list cut to (K, τ) by centred score: τ on the store's score, then the direct hits
    ordered by ``score - weight x typicality`` (their scores now the centred ones, ``rank`` renumbered)
    and cut to ``top_k``; each kept hit's window neighbours follow it, at its rank. A hit with no
    typicality (none could be had for it) keeps its own score.

    >>> from pgr_core.types import Fact, Scope
    >>> def hit(i, s, r): return Hit(Fact(f"f{i}", "x", Scope(user_id="u")), s, r)
    >>> hits = [hit(1, 0.6, 0), hit(2, 0.5, 1), hit(3, 0.4, 2), hit(4, 0.2, 3)]
    >>> typical = {"f1": 0.5, "f2": 0.1, "f3": 0.1, "f4": 0.0}
    >>> [(h.fact.id, h.rank, round(h.score, 2)) for h in centred(hits, typical, 1.0, 2, 0.3)]
    [('f2', 0, 0.4), ('f3', 1, 0.3)]
    """
    direct = [h for h in hits if h.neighbour_of is None and h.score >= min_score]
    scored = sorted(
        ((h.score - weight * typicality.get(h.key, 0.0), at, h) for at, h in enumerate(direct)),
        key=lambda entry: (-entry[0], entry[1]),
    )[:top_k]
    by_anchor: dict[str, list[Hit]] = {}
    for h in hits:
        if h.anchor is not None:
            by_anchor.setdefault(h.anchor, []).append(h)
    out: list[Hit] = []
    for rank, (score, _, h) in enumerate(scored):
        out.append(replace(h, score=score, rank=rank))
        out.extend(replace(n, rank=rank) for n in by_anchor.get(h.key, ()))
    return out


def distinct_hits(hit_lists: Sequence[Sequence[Hit]]) -> list[Fact]:
    """The facts of a round's distinct direct hits (by :attr:`Fact.key`), in first-seen order."""
    seen: dict[str, Fact] = {}
    for hits in hit_lists:
        for h in hits:
            if h.neighbour_of is None and h.key not in seen:
                seen[h.key] = h.fact
    return list(seen.values())
