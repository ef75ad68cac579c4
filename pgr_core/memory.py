"""The embedded default store: facts and their vectors in process memory, cosine by numpy."""

from __future__ import annotations

import json
import threading
import uuid
import zipfile
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ._dates import DateLike, parse_date
from .caches import CachedEmbedder
from .embedders import Embedder, default_embedder
from .errors import ConfigurationError, InvalidArgumentError
from .store import Store, validate_probes
from .types import Capabilities, Fact, Hit, Scope, SearchParams

__all__ = ["InMemoryStore"]

_FORMAT = "pgr-store/1"
_SCOPE_CACHE_SIZE = 1024  # scopes whose visible rows are kept between searches
_ScopeKey = tuple[str | None, str | None, str | None]


@dataclass
class _ScopeIndex:
    rows: np.ndarray  # row numbers visible to one scope
    version: int


class InMemoryStore(Store):
    """Facts in memory with their unit vectors; search is one matrix product per round.

    Keeps each fact's session and position, so the temporal window works. Save to and load from a
    single ``.pgr`` file with :meth:`save` / :meth:`load`.

    Probes are embedded through a :class:`~pgr_core.caches.CachedEmbedder` (``embedding_cache``
    entries, text → vector, shared by every scope; 0 for none), which PGR's probe hygiene shares, so a
    round's probes are embedded once. Facts are embedded straight, without filling that cache.
    Listeners (:meth:`~pgr_core.store.Store.add_listener`) hear of every write and deletion, with the
    scopes of the facts changed.

    >>> store = InMemoryStore(embedder=HashingEmbedder())  # doctest: +SKIP
    >>> store.add("I hurt my knee in March", scope=Scope(user_id="u1"), date="2025-03-10")  # doctest: +SKIP
    """

    capabilities: ClassVar[Capabilities] = Capabilities(writable=True, dates=True, cosine_scores=True, window=True)

    def __init__(self, embedder: Embedder | None = None, *, embedding_cache: int = 4096) -> None:
        if isinstance(embedding_cache, bool) or not isinstance(embedding_cache, int) or embedding_cache < 0:
            raise InvalidArgumentError(f"embedding_cache must be an integer >= 0, got {embedding_cache!r}")
        chosen = embedder if embedder is not None else default_embedder()
        self.embedder: Embedder = (
            CachedEmbedder.wrap(chosen, max_entries=embedding_cache) if embedding_cache else chosen
        )
        self._facts: list[Fact] = []
        self._ids: dict[str, int] = {}
        self._vectors = np.zeros((0, self.embedder.dim), dtype=np.float32)
        self._turns: dict[tuple[_ScopeKey, str, int], int] = {}  # (scope key, session, position) -> row
        self._scope_cache: OrderedDict[Scope, _ScopeIndex] = OrderedDict()
        self._version = 0
        self._lock = threading.RLock()
        self._aware: bool | None = None  # all dates aware, or all naive

    def __len__(self) -> int:
        return len(self._facts)

    @property
    def facts(self) -> list[Fact]:
        return list(self._facts)

    def get(self, fact_id: str) -> Fact | None:
        with self._lock:
            row = self._ids.get(fact_id)
            return None if row is None else self._facts[row]

    def vectors_for(self, fact_ids: Sequence[str]) -> np.ndarray:
        """The stored unit vectors of ``fact_ids``, one row each in that order (a copy); a KeyError
        names an id the store does not hold."""
        with self._lock:
            rows = []
            for fact_id in fact_ids:
                row = self._ids.get(fact_id)
                if row is None:
                    raise KeyError(f"no fact {fact_id!r} in this store")
                rows.append(row)
            return self._vectors[np.asarray(rows, dtype=np.int64)]  # fancy indexing copies

    # ------------------------------------------------------------------ writing

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
            metadata=dict(metadata or {}),
        )
        return self.add_facts([fact])[0]

    def add_facts(self, facts: Iterable[Fact], *, vectors: np.ndarray | None = None) -> list[str]:
        """Store facts (one embedding batch). Adding an id that exists replaces that fact.

        Every fact is checked before any is stored: a bad one leaves the store unchanged. Writes are
        copy-on-write: a search running meanwhile keeps reading the rows it started with, so it never
        sees a row half replaced (nor, through a replaced id, another owner's fact).
        """
        batch = list(facts)
        owners = self._write(batch, vectors)
        self._notify(owners)
        return [f.id for f in batch] if owners else []

    def _write(self, batch: list[Fact], vectors: np.ndarray | None) -> set[Scope]:
        """Store ``batch``; return the scopes whose facts changed (new owners and replaced ones)."""
        self._validate(batch)
        if vectors is None:
            if batch:  # straight to the model: a bulk write would flush the probe cache
                embedder = self.embedder
                embed = embedder.embed_uncached if isinstance(embedder, CachedEmbedder) else embedder.embed
                vectors = embed([f.text for f in batch])
        elif vectors.shape != (len(batch), self.embedder.dim):
            raise InvalidArgumentError(
                f"vectors must have shape ({len(batch)}, {self.embedder.dim}), got {vectors.shape}"
            )
        if not batch or vectors is None:
            return set()
        owners: set[Scope] = set()
        with self._lock:
            self._check_dates(batch)
            rows_now = len(self._vectors)
            facts, turns = list(self._facts), dict(self._turns)
            appended: list[np.ndarray] = []
            replaced: dict[int, np.ndarray] = {}
            for fact, vector in zip(batch, vectors, strict=True):
                row = self._ids.get(fact.id)
                if row is None:
                    row = len(facts)
                    self._ids[fact.id] = row
                    facts.append(fact)
                    appended.append(vector)
                else:
                    old = facts[row]
                    owners.add(old.scope)
                    if old.session_id is not None and old.position is not None:
                        turns.pop((_scope_key(old.scope), old.session_id, old.position), None)
                    facts[row] = fact
                    if row < rows_now:
                        replaced[row] = vector
                    else:  # replaced within this same batch
                        appended[row - rows_now] = vector
                owners.add(fact.scope)
                if fact.session_id is not None and fact.position is not None:
                    turns[(_scope_key(fact.scope), fact.session_id, fact.position)] = row
            matrix = self._vectors.copy() if replaced else self._vectors
            for row, vector in replaced.items():
                matrix[row] = vector
            if appended:
                matrix = np.vstack([matrix, np.asarray(appended, dtype=np.float32)])
            self._facts, self._turns, self._vectors = facts, turns, matrix
            self._version += 1
            self._scope_cache.clear()  # every scope's rows are recomputed after any write or deletion
        return owners

    def delete(self, fact_ids: Iterable[str]) -> int:
        """Remove facts by id; returns how many were removed. Every scope's cached rows are dropped, and
        listeners hear of the removed facts' scopes."""
        wanted = set(fact_ids)
        with self._lock:  # one critical section: no search sees the store emptied half-way
            doomed = {i for i in wanted if i in self._ids}
            if not doomed:
                return 0
            owners = {self._facts[self._ids[i]].scope for i in doomed}
            keep = [r for r, f in enumerate(self._facts) if f.id not in doomed]
            facts = [self._facts[r] for r in keep]
            vectors = self._vectors[keep] if keep else np.zeros((0, self.embedder.dim), np.float32)
            self._facts, self._ids, self._turns = [], {}, {}
            self._vectors = np.zeros((0, self.embedder.dim), dtype=np.float32)
            self._aware = None
            self._version += 1
            self._scope_cache.clear()
            self._write(facts, vectors)  # the lock is re-entrant
        self._notify(owners)
        return len(doomed)

    def _validate(self, batch: list[Fact]) -> None:
        for i, fact in enumerate(batch):
            if not isinstance(fact, Fact):
                raise InvalidArgumentError(f"item {i} is a {type(fact).__name__}, not a Fact")
            if not isinstance(fact.text, str) or not fact.text.strip():
                raise InvalidArgumentError(f"fact {fact.id!r} has empty text")
            if not isinstance(fact.id, str) or not fact.id:
                raise InvalidArgumentError(f"fact {i} needs a non-empty string id")
            if (fact.session_id is None) != (fact.position is None):
                raise InvalidArgumentError(f"fact {fact.id!r}: give both session_id and position, or neither")
            if not isinstance(fact.scope, Scope):
                raise InvalidArgumentError(f"fact {fact.id!r} needs a Scope, got {type(fact.scope).__name__}")

    def _check_dates(self, batch: list[Fact]) -> None:
        """All dates timezone-aware, or all naive (checked under the lock: it reads the store's kind)."""
        aware = self._aware
        for fact in batch:
            for moment in (fact.date, fact.updated_at):
                if moment is None:
                    continue
                kind = moment.tzinfo is not None and moment.utcoffset() is not None
                if aware is None:
                    aware = kind
                elif kind != aware:
                    raise InvalidArgumentError(
                        f"fact {fact.id!r} has a {'timezone-aware' if kind else 'naive'} date but this "
                        f"store holds {'aware' if aware else 'naive'} ones; use one kind for all dates"
                    )
        self._aware = aware

    # ------------------------------------------------------------------ searching

    def _rows_for(self, scope: Scope) -> np.ndarray:
        """The rows ``scope`` may see. Cached per scope (the key is the whole Scope, so two tenants never
        share an entry); any write or deletion clears the cache; least recently used scopes go first."""
        cached = self._scope_cache.get(scope)
        if cached is not None and cached.version == self._version:
            self._scope_cache.move_to_end(scope)
            return cached.rows
        rows = np.fromiter((r for r, f in enumerate(self._facts) if scope.allows(f.scope)), dtype=np.int64)
        self._scope_cache[scope] = _ScopeIndex(rows, self._version)
        while len(self._scope_cache) > _SCOPE_CACHE_SIZE:
            self._scope_cache.popitem(last=False)
        return rows

    def search_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        probes = validate_probes(probes)
        scope = Scope.coerce(scope)
        if not probes:
            return []
        with self._lock:  # a consistent snapshot; writers replace these objects, never mutate them
            rows = self._rows_for(scope)
            facts, vectors, turns = self._facts, self._vectors, self._turns
        if rows.size == 0:
            return [[] for _ in probes]
        queries = self.embedder.embed(probes)
        scores = queries @ vectors[rows].T  # (probes, visible facts)
        k = min(params.top_k, rows.size)
        results: list[list[Hit]] = []
        for p in range(len(probes)):
            row_scores = scores[p]
            top = np.argpartition(-row_scores, k - 1)[:k] if k < rows.size else np.arange(rows.size)
            top = top[np.argsort(-row_scores[top], kind="stable")]
            hits: list[Hit] = []
            for rank, local in enumerate(top):
                score = float(row_scores[local])
                if score < params.min_score:
                    break
                fact = facts[int(rows[local])]
                hits.append(Hit(fact=fact, score=score, rank=rank))
                if params.window:
                    hits.extend(_neighbours(facts, turns, fact, params.window, rank))
            results.append(hits)
        return results

    # ------------------------------------------------------------------ files

    def save(self, path: str | Path) -> Path:
        """Write every fact and vector to one file (a zip holding JSON and a numpy array)."""
        path = Path(path)
        meta = {"format": _FORMAT, "embedder": self.embedder.name, "dim": self.embedder.dim}
        with self._lock:
            snapshot, vectors = self._facts, self._vectors
        facts = [f.to_dict() for f in snapshot]
        tmp = path.with_suffix(path.suffix + ".tmp")
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("meta.json", json.dumps(meta))
            zf.writestr("facts.jsonl", "\n".join(json.dumps(f, ensure_ascii=False) for f in facts))
            with zf.open("vectors.npy", "w") as fh:
                np.save(fh, vectors)
        tmp.replace(path)  # atomic: a crash mid-save never leaves a half-written store
        return path

    @classmethod
    def load(cls, path: str | Path, embedder: Embedder | None = None) -> InMemoryStore:
        """Read a file written by :meth:`save`. The embedder must be the one that wrote it."""
        path = Path(path)
        if not path.exists():
            raise ConfigurationError(f"no store file at {path}; create one with `pgr demo --save-store {path}`")
        try:
            with zipfile.ZipFile(path) as zf:
                meta = json.loads(zf.read("meta.json"))
                lines = zf.read("facts.jsonl").decode("utf-8").splitlines()
                with zf.open("vectors.npy") as fh:
                    vectors = np.load(fh)
        except (zipfile.BadZipFile, KeyError, ValueError) as exc:
            raise ConfigurationError(f"{path} is not a pgr store file ({exc})") from exc
        if meta.get("format") != _FORMAT:
            raise ConfigurationError(f"{path}: unknown store format {meta.get('format')!r}")
        store = cls(embedder=embedder)
        if store.embedder.name != meta["embedder"]:
            raise ConfigurationError(
                f"{path} was embedded with {meta['embedder']}, not {store.embedder.name}; "
                "load it with the same embedder"
            )
        store.add_facts([_fact_from_dict(json.loads(line)) for line in lines if line], vectors=vectors)
        return store


def _neighbours(
    facts: list[Fact], turns: Mapping[tuple[_ScopeKey, str, int], int], fact: Fact, window: int, rank: int
) -> list[Hit]:
    """The ±window turns of ``fact``'s session, from the same snapshot as the search (same owner only)."""
    if fact.session_id is None or fact.position is None:
        return []
    key = _scope_key(fact.scope)
    out = []
    for offset in [d for w in range(1, window + 1) for d in (-w, w)]:
        row = turns.get((key, fact.session_id, fact.position + offset))
        if row is not None:
            out.append(Hit(fact=facts[row], score=0.0, rank=rank, neighbour_of=fact.id))
    return out


def _scope_key(scope: Scope) -> _ScopeKey:
    return (scope.user_id, scope.agent_id, scope.run_id)


def _fact_from_dict(data: Mapping[str, Any]) -> Fact:
    return Fact(
        id=data["id"],
        text=data["text"],
        scope=Scope(**data["scope"]),
        type=data.get("type"),
        date=parse_date(data.get("date")),
        updated_at=parse_date(data.get("updated_at")),
        session_id=data.get("session_id"),
        position=data.get("position"),
        metadata=data.get("metadata") or {},
    )
