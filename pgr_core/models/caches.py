"""pgr's caches: what each one keys on, what it may serve, and when it is cleared.

- :class:`CachedEmbedder`: probe text → vector, least recently used first out, kept apart per scope.
  A vector depends on the text alone, but *whether it is cached* says that someone asked that text:
  served across scopes, a hit (in ``embed_cache_hits``, in ``embed_texts``, or in the time a call
  takes) would tell bob that alice asked the same question. So an entry serves only the scope of the
  PGR call that filled it (the call's scope is on its :class:`EmbedCount`); embeddings made outside
  any PGR call share one partition of their own. The embedded store embeds its probes through one,
  and PGR's probe hygiene shares it, so the store's embedding of a round's probes is served from the
  vectors hygiene has just computed (and the query, embedded once per call, is reused all call).
- :class:`ProspectionCache` (opt-in, ``PGR(phase1_reuse=True)``): a Phase-1 prospection (the augmented
  intent and the initial steps) reused for a near-identical later query. Personal context went into
  it, so it is keyed by the whole :class:`~pgr_core.types.Scope` and by the query date, bounded per
  scope and in time, and cleared for a scope as soon as its store reports a write or deletion there.

Counting: while PGR runs a call it installs an :class:`EmbedCount` (a context variable, so concurrent
calls in threads or asyncio tasks each count their own); every :class:`CachedEmbedder` reports to it,
and the count turns into ``embed_calls``, ``embed_texts`` and ``embed_cache_hits`` in the trace's usage.
The same count carries the call's switch (with ``use_cache=False`` every cache passes straight through)
and its scope, the cache partition it reads and fills; since a call is served only what its own scope
filled, its hit count is its own business.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from pgr_core.errors import InvalidArgumentError

if TYPE_CHECKING:
    from pgr_core.observability.trace import Step
    from pgr_core.types import Embedder, Scope

__all__ = ["CachedEmbedder", "EmbedCount", "ProspectionCache", "Reusable", "counting_embeddings"]

log = logging.getLogger("pgr")


# ====================================================================== embeddings


@dataclass
class EmbedCount:
    """What one retrieval asked of its embedders: ``calls`` that reached an embedding model, the
    ``texts`` the model embedded, and the texts served from a cache (``hits``). ``scope`` (set by PGR
    when the call first embeds) is the cache partition the call reads and fills."""

    use_cache: bool = True
    scope: Scope | None = None
    calls: int = 0
    texts: int = 0
    hits: int = 0

    def snapshot(self) -> tuple[int, int, int]:
        return self.calls, self.texts, self.hits


_COUNT: ContextVar[EmbedCount | None] = ContextVar("pgr_embed_count", default=None)


@contextmanager
def counting_embeddings(use_cache: bool = True) -> Iterator[EmbedCount]:
    """Count (and switch) every :class:`CachedEmbedder` used in this context until the block ends.

    Threads started with ``asyncio.to_thread`` inherit the count (it travels with the context), so a
    store's embedding in a worker thread is billed to the call that asked for it.
    """
    count = EmbedCount(use_cache=use_cache)
    token = _COUNT.set(count)
    try:
        yield count
    finally:
        _COUNT.reset(token)


def current_count() -> EmbedCount | None:
    """The count of the call running in this context (None outside PGR)."""
    return _COUNT.get()


class CachedEmbedder:
    """An embedder with a bounded cache of text → vector in front of it (least recently used out).

    The vectors are exactly those of ``inner`` (a cached row is the row ``inner`` returned), so the
    cache changes cost, never results. Entries are kept per scope: a PGR call is served only the
    vectors that calls of its own scope filled, so neither its hit count nor its speed tells anyone
    what another scope asked (the price: a text two users ask is embedded once for each). Embedding
    outside PGR uses one partition of its own. Thread-safe; texts missing from the cache go to
    ``inner`` in one call. ``max_entries`` bounds all partitions together; ``0`` keeps nothing (every
    text goes to ``inner``, still counted).

    >>> embedder = CachedEmbedder(HashingEmbedder(), max_entries=4096)  # doctest: +SKIP
    """

    def __init__(self, inner: Embedder, *, max_entries: int = 4096) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 0:
            raise InvalidArgumentError(f"max_entries must be an integer >= 0, got {max_entries!r}")
        self.inner = inner
        # a store's embedder may be anything with embed(); name and dim are read when it has them
        self.name: str = getattr(inner, "name", type(inner).__name__)
        self.dim: int = getattr(inner, "dim", 0)
        self.max_entries = max_entries
        self._cache: OrderedDict[tuple[Scope | None, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0  # over the embedder's life, every caller together
        self.misses = 0

    @classmethod
    def wrap(cls, embedder: Embedder, *, max_entries: int = 4096) -> CachedEmbedder:
        """``embedder`` itself when it already caches (so its cache is shared), else a new cache on it."""
        return embedder if isinstance(embedder, CachedEmbedder) else cls(embedder, max_entries=max_entries)

    def __repr__(self) -> str:
        return f"CachedEmbedder({self.inner!r}, max_entries={self.max_entries})"

    def __len__(self) -> int:
        return len(self._cache)

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()

    def embed_uncached(self, texts: Sequence[str]) -> np.ndarray:
        """Straight to the model, the cache left as it is (bulk writes of facts use this)."""
        return np.asarray(self.inner.embed(texts), dtype=np.float32)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        count = _COUNT.get()
        use = self.max_entries > 0 and (count is None or count.use_cache)
        partition = count.scope if count is not None else None  # only what this scope filled is served
        known: dict[str, np.ndarray] = {}
        if use:
            with self._lock:
                for t in texts:
                    row = self._cache.get((partition, t))
                    if row is not None:
                        self._cache.move_to_end((partition, t))
                        known[t] = row
        hits = sum(1 for t in texts if t in known)
        missing = [t for t in dict.fromkeys(texts) if t not in known]
        if missing:
            rows = np.asarray(self.inner.embed(missing), dtype=np.float32)
            if rows.ndim != 2 or rows.shape[0] != len(missing) or (self.dim and rows.shape[1] != self.dim):
                raise ValueError(f"{self.inner!r} returned shape {rows.shape} for {len(missing)} texts")
            fresh = dict(zip(missing, rows, strict=True))
            known.update(fresh)
            if use:
                with self._lock:
                    self._cache.update(((partition, t), row) for t, row in fresh.items())
                    while len(self._cache) > self.max_entries:
                        self._cache.popitem(last=False)
        with self._lock:
            self.hits += hits
            self.misses += len(missing)
        if count is not None:
            count.hits += hits
            count.texts += len(missing)
            count.calls += 1 if missing else 0
        return np.stack([known[t] for t in texts]).astype(np.float32, copy=False)


# ====================================================================== Phase-1 reuse


@dataclass(frozen=True)
class Reusable:
    """A Phase-1 prospection kept for reuse: the query it answered, q_A and the initial steps."""

    query: str
    intent: str
    steps: tuple[Step, ...]
    similarity: float = 1.0  # the cosine of the query that reused it (set on a hit)


@dataclass
class _Entry:
    query: str
    vector: np.ndarray
    date: str | None
    intent: str
    steps: tuple[Step, ...]
    created: float


@dataclass
class _Bucket:
    version: int
    entries: OrderedDict[int, _Entry] = field(default_factory=OrderedDict)


class ProspectionCache:
    """Phase-1 prospections of earlier queries, reused for a near-identical query in the same scope.

    A query whose cosine to an earlier one (same :class:`Scope`, same query date) reaches
    ``threshold`` gets that query's q_A and initial steps: the augmentation and Phase-1 LLM calls are
    skipped, the store is still probed afresh. Bounded: ``max_entries`` per scope and ``max_scopes``
    scopes (least recently used out), each entry at most ``ttl_s`` seconds old.

    Tenant safety: entries are keyed by the whole scope and are never served to another. A store that
    reports changes (:meth:`~pgr_core.stores.contract.Store.add_listener`) clears every scope that can see a
    changed fact; each scope also keeps a version, and a prospection that started before a change in
    its scope is not stored when it ends. A store that reports nothing is bounded by the TTL alone.
    Thread- and asyncio-safe (one lock, held only for dictionary work).
    """

    def __init__(
        self,
        *,
        threshold: float = 0.95,
        max_entries: int = 64,
        ttl_s: float = 3600.0,
        max_scopes: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0.0 < threshold <= 1.0:
            raise InvalidArgumentError(f"threshold must be a number in (0, 1], got {threshold!r}")
        for name, value in (("max_entries", max_entries), ("max_scopes", max_scopes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be an integer >= 1, got {value!r}")
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not ttl_s > 0:
            raise InvalidArgumentError(f"ttl_s must be a number of seconds > 0, got {ttl_s!r}")
        self.threshold = float(threshold)
        self.max_entries = max_entries
        self.ttl_s = float(ttl_s)
        self.max_scopes = max_scopes
        self._clock = clock
        self._buckets: OrderedDict[Scope, _Bucket] = OrderedDict()
        self._lock = threading.Lock()
        self._versions = itertools.count(1)  # global, so a bucket rebuilt after eviction never reuses one
        self._ids = itertools.count()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(b.entries) for b in self._buckets.values())

    def _bucket(self, scope: Scope) -> _Bucket:
        bucket = self._buckets.get(scope)
        if bucket is None:
            bucket = self._buckets[scope] = _Bucket(version=next(self._versions))
            while len(self._buckets) > self.max_scopes:
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(scope)
        return bucket

    def begin(self, scope: Scope) -> int:
        """The scope's version now; pass it to :meth:`put` so a prospection that outlived a change is
        not stored."""
        with self._lock:
            return self._bucket(scope).version

    def lookup(self, scope: Scope, date: str | None, vector: np.ndarray) -> Reusable | None:
        """The closest live entry of ``scope`` and ``date`` at cosine >= ``threshold`` (None if none)."""
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(scope)
            if bucket is None:
                return None
            best: tuple[float, int] | None = None
            for key, entry in list(bucket.entries.items()):
                if now - entry.created > self.ttl_s:
                    del bucket.entries[key]
                    continue
                if entry.date != date:
                    continue
                sim = float(entry.vector @ vector)
                if sim >= self.threshold and (best is None or sim > best[0]):
                    best = (sim, key)
            if best is None:
                return None
            entry = bucket.entries[best[1]]
            bucket.entries.move_to_end(best[1])
            self._buckets.move_to_end(scope)
            return Reusable(entry.query, entry.intent, entry.steps, similarity=best[0])

    def put(
        self,
        scope: Scope,
        date: str | None,
        query: str,
        vector: np.ndarray,
        intent: str,
        steps: Sequence[Step],
        *,
        version: int,
    ) -> bool:
        """Keep a prospection; refused (False) when ``scope`` changed since :meth:`begin` gave ``version``."""
        frozen = tuple(replace(s, children=list(s.children), probe=None) for s in steps)
        with self._lock:
            bucket = self._buckets.get(scope)
            if bucket is None or bucket.version != version:
                return False
            bucket.entries[next(self._ids)] = _Entry(
                query, np.asarray(vector, dtype=np.float32), date, intent, frozen, self._clock()
            )
            while len(bucket.entries) > self.max_entries:
                bucket.entries.popitem(last=False)
            return True

    def invalidate(self, scopes: Collection[Scope] | None = None) -> int:
        """Drop the entries of every cached scope that can see a fact owned by one of ``scopes`` (all
        entries when None) and move those scopes to a new version. Returns the entries dropped.

        This is the listener a store calls after a write or deletion. It never raises: when it cannot
        tell which cached scopes a change touched (an owner that is not a :class:`Scope`), it drops
        every entry, logged on the ``pgr`` logger, rather than keep one that may be stale.
        """
        with self._lock:
            try:
                owners = None if scopes is None else list(scopes)
                touched = [
                    bucket
                    for scope, bucket in self._buckets.items()
                    if owners is None or any(scope.allows(owner) for owner in owners)
                ]
            except Exception:
                log.warning(
                    "the Phase-1 reuse cache could not match a store change to its scopes (%r): dropping all of it\n%s",
                    scopes,
                    traceback.format_exc(),  # as text: a record holding the traceback would hold its frames
                )
                touched = list(self._buckets.values())
            dropped = 0
            for bucket in touched:
                dropped += len(bucket.entries)
                bucket.entries.clear()
                bucket.version = next(self._versions)
        return dropped

    def clear(self) -> None:
        self.invalidate(None)

    def __call__(self, scopes: Collection[Scope]) -> None:  # the store-listener signature
        self.invalidate(scopes)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"scopes": len(self._buckets), "entries": sum(len(b.entries) for b in self._buckets.values())}
