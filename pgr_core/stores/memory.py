"""The embedded default store: facts and their vectors in process memory, cosine by numpy.

Layout. Facts are grouped by owner, the exact :class:`~pgr_core.types.Scope` of each fact. An owner's
facts live in one :class:`_Block`: a float32 matrix that grows by doubling (an append copies now and
then, and only that owner's rows), its facts in row order, its session turns and its id → row map.
An index from each user_id / agent_id / run_id value to the owners holding it lets a search find the
owners its scope allows without looking at any other fact. No write and no search does O(N) work.

Concurrency. Writes and each search's snapshot take one lock. A search snapshots, per owner, the
matrix, the number of live rows, the fact list and the turns, then reads only rows below that number
outside the lock. Appends fill rows past every published length; anything that changes a published
row (a replacement, a deletion) builds fresh arrays for that owner only (copy-on-write), so a running
search never sees a half-written or replaced row.

Ids are unique per owner: re-adding an id replaces the owner's fact; an id another owner holds is
refused. ``get``, ``delete`` and ``vectors_for`` require ``scope=``: a caller only ever reaches the
facts its scope allows.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
import threading
import zipfile
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np

from pgr_core._dates import parse_date
from pgr_core.errors import ConfigurationError, InvalidArgumentError
from pgr_core.models.caches import CachedEmbedder
from pgr_core.models.embedders import Embedder, default_embedder
from pgr_core.stores._filelock import StoreLock
from pgr_core.stores._validate import check_date_kind, check_fact, check_facts, check_id, check_ids, check_vectors
from pgr_core.stores.contract import AddsOneFact, Store, validate_probes
from pgr_core.types import EVERY_ABILITY, Capabilities, Fact, Hit, Scope, SearchParams

__all__ = ["InMemoryStore"]

_FORMAT = "pgr-store/1"
_META_KEYS = ("format", "embedder", "dim")
_SCOPE_CACHE_SIZE = 1024  # query scopes whose owners are kept between searches
_MIN_ROWS = 8  # a new owner's first capacity
_FIELDS = ("user_id", "agent_id", "run_id")
_DAMAGED = (
    "the file is damaged or was not written by InMemoryStore.save(): restore it from a backup, or "
    "rebuild the store (add the facts again) and save it"
)
_Turn = tuple[str, int]  # (session_id, position)


class _View(NamedTuple):
    """What a search reads of one owner: rows below ``n`` of ``vectors`` never change once published."""

    owner: Scope
    vectors: np.ndarray
    n: int
    facts: list[Fact]
    turns: dict[_Turn, int]


class _Block:
    """One owner's facts and vectors (every method runs under the store's lock)."""

    __slots__ = ("facts", "length", "owner", "rows", "turns", "vectors")

    def __init__(self, owner: Scope, dim: int) -> None:
        self.owner = owner
        self.vectors = np.empty((0, dim), dtype=np.float32)
        self.length = 0  # rows published to searches; == len(self.facts) between writes
        self.facts: list[Fact] = []
        self.turns: dict[_Turn, int] = {}
        self.rows: dict[str, int] = {}  # read by writers only, so it may change in place

    def view(self) -> _View:
        return _View(self.owner, self.vectors, self.length, self.facts, self.turns)

    def _capacity_for(self, rows: int) -> int:
        return max(rows, 2 * len(self.vectors), _MIN_ROWS) if rows > len(self.vectors) else len(self.vectors)

    def _reserve(self, extra: int) -> None:
        """Room for ``extra`` appended rows; growing copies this owner's live rows into a new matrix."""
        needed = self.length + extra
        if needed > len(self.vectors):
            grown = np.empty((self._capacity_for(needed), self.vectors.shape[1]), dtype=np.float32)
            grown[: self.length] = self.vectors[: self.length]
            self.vectors = grown

    def _fork(self, extra: int) -> None:
        """Private copies of everything a search may be reading, before a published row changes."""
        forked = np.empty((self._capacity_for(self.length + extra), self.vectors.shape[1]), dtype=np.float32)
        forked[: self.length] = self.vectors[: self.length]
        self.vectors, self.facts, self.turns = forked, list(self.facts), dict(self.turns)

    def write(self, facts: list[Fact], vectors: np.ndarray) -> list[Fact]:
        """Append or replace ``facts`` (all owned by this block); returns the facts replaced."""
        published = any(f.id in self.rows for f in facts) or any(
            f.session_id is not None and (f.session_id, f.position) in self.turns for f in facts
        )
        if published:
            self._fork(len(facts))
        else:
            self._reserve(len(facts))
        start, replaced = len(self.facts), []
        if not published and len({f.id for f in facts}) == len(facts):  # the bulk path: one block copy
            self.vectors[start : start + len(facts)] = vectors
            self.facts.extend(facts)
            for row, fact in enumerate(facts, start):
                self.rows[fact.id] = row
                if fact.session_id is not None and fact.position is not None:
                    self.turns[(fact.session_id, fact.position)] = row
        else:
            for fact, vector in zip(facts, vectors, strict=True):
                held = self.rows.get(fact.id)
                if held is None:
                    row = len(self.facts)
                    self.rows[fact.id] = row
                    self.facts.append(fact)
                else:
                    row, old = held, self.facts[held]
                    replaced.append(old)
                    if old.session_id is not None and old.position is not None:
                        if self.turns.get((old.session_id, old.position)) == row:
                            del self.turns[(old.session_id, old.position)]
                    self.facts[row] = fact
                self.vectors[row] = vector
                if fact.session_id is not None and fact.position is not None:
                    self.turns[(fact.session_id, fact.position)] = row
        self.length = len(self.facts)  # publish last
        return replaced

    def remove(self, ids: set[str]) -> list[Fact]:
        """Drop ``ids`` (copy-on-write: a running search keeps its rows); returns the facts removed."""
        keep = [r for r in range(self.length) if self.facts[r].id not in ids]
        removed = [self.facts[r] for r in range(self.length) if self.facts[r].id in ids]
        vectors = np.empty((max(len(keep), _MIN_ROWS), self.vectors.shape[1]), dtype=np.float32)
        vectors[: len(keep)] = self.vectors[np.asarray(keep, dtype=np.int64)]
        facts = [self.facts[r] for r in keep]
        turns = {
            (f.session_id, f.position): row
            for row, f in enumerate(facts)
            if f.session_id is not None and f.position is not None
        }
        self.vectors, self.facts, self.turns = vectors, facts, turns
        self.rows = {f.id: row for row, f in enumerate(facts)}
        self.length = len(facts)
        return removed


class InMemoryStore(AddsOneFact, Store):
    """Facts in memory with their unit vectors; search is one matrix product per owner and round.

    Keeps each fact's session and position, so the temporal window works. Save to and load from a
    single ``.pgr`` file with :meth:`save` / :meth:`load`.

    Probes are embedded through a :class:`~pgr_core.models.caches.CachedEmbedder` (``embedding_cache``
    entries, text → vector, shared by every scope; 0 for none), which PGR's probe hygiene shares, so a
    round's probes are embedded once. Facts are embedded straight, without filling that cache.
    Listeners (:meth:`~pgr_core.stores.contract.Store.add_listener`) hear of every write and deletion, with the
    scopes of the facts changed.

    Fact ids are unique per owner (the fact's exact scope): adding an id the same owner holds replaces
    that fact; adding an id another owner holds is refused. :meth:`get`, :meth:`delete` and
    :meth:`vectors_for` require ``scope=``, so a caller only ever reaches facts its scope allows.

    >>> store = InMemoryStore(embedder=HashingEmbedder())  # doctest: +SKIP
    >>> store.add("I hurt my knee in March", scope=Scope(user_id="u1"), date="2025-03-10")  # doctest: +SKIP
    """

    capabilities: ClassVar[Capabilities] = EVERY_ABILITY

    def __init__(self, embedder: Embedder | None = None, *, embedding_cache: int = 4096) -> None:
        if isinstance(embedding_cache, bool) or not isinstance(embedding_cache, int) or embedding_cache < 0:
            raise InvalidArgumentError(f"embedding_cache must be an integer >= 0, got {embedding_cache!r}")
        chosen = embedder if embedder is not None else default_embedder()
        self.embedder: Embedder = (
            CachedEmbedder.wrap(chosen, max_entries=embedding_cache) if embedding_cache else chosen
        )
        self._blocks: dict[Scope, _Block] = {}  # in the order owners first appeared
        self._owner_of: dict[str, Scope] = {}  # fact id -> owner
        self._owners_by: dict[tuple[str, str], dict[Scope, None]] = {}  # ("user_id", "u1") -> owners
        self._scope_cache: OrderedDict[Scope, tuple[Scope, ...]] = OrderedDict()
        self._lock = threading.RLock()
        self._aware: bool | None = None  # all dates aware, or all naive
        self._dated = 0  # facts holding a date; at 0 the store takes either kind again
        self._files: dict[str, tuple[int, int, int]] = {}  # a file this store loaded -> its signature then

    def __len__(self) -> int:
        return len(self._owner_of)

    @property
    def facts(self) -> list[Fact]:
        """Every fact, owner by owner (owners in the order they first appeared)."""
        with self._lock:
            return [f for b in self._blocks.values() for f in b.facts[: b.length]]

    @property
    def _vectors(self) -> np.ndarray:
        """Every vector in the order of :attr:`facts` (a copy; for tests and saving)."""
        with self._lock:
            views = [b.view() for b in self._blocks.values()]
        if not views:
            return np.zeros((0, self.embedder.dim), dtype=np.float32)
        return np.concatenate([v.vectors[: v.n] for v in views])

    def facts_for(self, scope: Scope | Mapping[str, str]) -> list[Fact]:
        """The facts ``scope`` allows, owner by owner."""
        scope = Scope.coerce(scope)
        with self._lock:
            return [f for o in self._owners_for(scope) for f in self._blocks[o].facts[: self._blocks[o].length]]

    def get(self, fact_id: str, *, scope: Scope | Mapping[str, str]) -> Fact | None:
        """The fact with ``fact_id`` that ``scope`` may see, or None."""
        allowed = Scope.coerce(scope)
        fact_id = check_id(fact_id)
        with self._lock:
            located = self._locate(fact_id, allowed)
            return None if located is None else located[0].facts[located[1]]

    def get_many(self, fact_ids: Sequence[str], *, scope: Scope | Mapping[str, str]) -> dict[str, Fact]:
        """fact id -> fact for those of ``fact_ids`` that ``scope`` may see (unknown ids left out)."""
        allowed = Scope.coerce(scope)
        with self._lock:
            found = ((i, self._locate(i, allowed)) for i in fact_ids)
            return {i: where[0].facts[where[1]] for i, where in found if where is not None}

    def with_window(
        self, hits: Sequence[Hit], *, scope: Scope | Mapping[str, str], window: int
    ) -> dict[str, list[Hit]]:
        """The ±window same-session neighbours of each hit's fact: fact id -> hits (owner's own only)."""
        allowed = Scope.coerce(scope)
        out: dict[str, list[Hit]] = {}
        with self._lock:
            for hit in hits:
                located = self._locate(hit.fact.id, allowed)
                if located is not None:
                    found = _neighbours(located[0].view(), hit.fact, window, hit.rank)
                    if found:
                        out[hit.fact.id] = found
        return out

    def vectors_for(self, fact_ids: Sequence[str], *, scope: Scope | Mapping[str, str]) -> np.ndarray:
        """The stored unit vectors of ``fact_ids``, one row each in that order (a copy); a KeyError
        names an id the store does not hold or that ``scope`` may not see."""
        allowed = Scope.coerce(scope)
        with self._lock:
            out = np.empty((len(fact_ids), self.embedder.dim), dtype=np.float32)
            for i, fact_id in enumerate(fact_ids):
                located = self._locate(fact_id, allowed)
                if located is None:
                    raise KeyError(
                        f"no fact {fact_id!r} in this store" + ("" if allowed is None else " for this scope")
                    )
                out[i] = located[0].vectors[located[1]]
            return out

    def _locate(self, fact_id: str, allowed: Scope | None) -> tuple[_Block, int] | None:
        owner = self._owner_of.get(fact_id) if isinstance(fact_id, str) else None
        if owner is None or (allowed is not None and not allowed.allows(owner)):
            return None
        block = self._blocks[owner]
        return block, block.rows[fact_id]

    # ------------------------------------------------------------------ writing

    def add_facts(self, facts: Iterable[Fact], *, vectors: np.ndarray | None = None) -> list[str]:
        """Store facts (one embedding batch). Adding an id its owner already holds replaces that fact;
        an id held by another owner is refused.

        Every fact (and every given vector) is checked before any is stored: a bad one leaves the store
        unchanged. A search running meanwhile keeps reading the rows it started with.
        """
        batch = check_facts(list(facts))
        if vectors is not None:
            vectors = check_vectors(vectors, len(batch), self.embedder.dim)
        if not batch:
            return []
        if vectors is None:
            with self._lock:
                self._check_owners(batch)  # before paying for the embedding; checked again at the write
            vectors = self._embed(batch)
        owners = self._write(batch, vectors)
        self._notify(owners)
        return [f.id for f in batch]

    def _embed(self, batch: list[Fact]) -> np.ndarray:
        """Straight to the model: a bulk write would flush the probe cache. A zero row is allowed (the
        embedder's honest answer for a text it has no features for); NaN is not."""
        embedder = self.embedder
        embed = embedder.embed_uncached if isinstance(embedder, CachedEmbedder) else embedder.embed
        vectors = np.asarray(embed([f.text for f in batch]), dtype=np.float32)
        name = self.embedder.name
        if vectors.shape != (len(batch), self.embedder.dim):
            raise InvalidArgumentError(
                f"the embedder {name} returned vectors of shape {vectors.shape} for {len(batch)} facts; "
                f"expected ({len(batch)}, {self.embedder.dim})"
            )
        bad = _nonfinite_row(vectors)
        if bad is not None:
            raise InvalidArgumentError(
                f"the embedder {name} gave NaN or infinite values for fact {batch[bad].id!r}; nothing was stored"
            )
        return vectors

    def _write(self, batch: list[Fact], vectors: np.ndarray) -> set[Scope]:
        """Store a checked ``batch``; return the owners whose facts changed."""
        with self._lock:
            self._check_owners(batch)
            aware = check_date_kind(batch, self._aware)
            groups: dict[Scope, list[int]] = {}
            for i, fact in enumerate(batch):
                groups.setdefault(fact.scope, []).append(i)
            whole = len(groups) == 1
            for owner, rows in groups.items():
                block = self._blocks.get(owner)
                if block is None:
                    block = self._blocks[owner] = _Block(owner, self.embedder.dim)
                    for key in _keys(owner):
                        self._owners_by.setdefault(key, {})[owner] = None
                    self._scope_cache.clear()  # a new owner: a cached scope may now allow it
                mine = batch if whole else [batch[i] for i in rows]
                replaced = block.write(mine, vectors if whole else vectors[np.asarray(rows, dtype=np.int64)])
                for fact in mine:
                    self._owner_of[fact.id] = owner
                self._dated += sum(map(_dated, mine)) - sum(map(_dated, replaced))
            self._aware = aware if self._dated else None
        return set(groups)

    def delete(self, fact_ids: Iterable[str], *, scope: Scope | Mapping[str, str]) -> int:
        """Remove the facts ``fact_ids`` that ``scope`` allows; returns how many were removed. Only the
        owners concerned are rebuilt; listeners hear of their scopes."""
        allowed = Scope.coerce(scope)
        wanted = set(check_ids(fact_ids))
        with self._lock:  # one critical section: no search sees an owner emptied half-way
            doomed: dict[Scope, set[str]] = {}
            for fact_id in wanted:
                located = self._locate(fact_id, allowed)
                if located is not None:
                    doomed.setdefault(located[0].owner, set()).add(fact_id)
            if not doomed:
                return 0
            for owner, ids in doomed.items():
                block = self._blocks[owner]
                self._dated -= sum(map(_dated, block.remove(ids)))
                for fact_id in ids:
                    del self._owner_of[fact_id]
                if not block.length:
                    del self._blocks[owner]
                    for key in _keys(owner):
                        holders = self._owners_by[key]
                        del holders[owner]
                        if not holders:
                            del self._owners_by[key]
            if not self._dated:
                self._aware = None
            self._scope_cache.clear()
        self._notify(doomed)
        return sum(len(ids) for ids in doomed.values())

    def _check_owners(self, batch: list[Fact]) -> None:
        """Ids are unique per owner (under the lock: it reads who holds each id)."""
        seen: dict[str, Scope] = {}
        for fact in batch:
            holder = self._owner_of.get(fact.id) or seen.setdefault(fact.id, fact.scope)
            if holder != fact.scope:
                raise InvalidArgumentError(
                    f"fact id {fact.id!r} belongs to another owner: ids are unique per owner, so this write "
                    "would replace someone else's fact; pick another id (or let add() make one)"
                )

    # ------------------------------------------------------------------ searching

    def _owners_for(self, scope: Scope) -> tuple[Scope, ...]:
        """The owners ``scope`` allows, found through the smallest index entry of its set fields.
        Cached per scope (least recently used go first); a new owner or a deletion clears the cache."""
        cached = self._scope_cache.get(scope)
        if cached is not None:
            self._scope_cache.move_to_end(scope)
            return cached
        pools = [self._owners_by.get(key, {}) for key in _keys(scope)]
        owners = tuple(o for o in min(pools, key=len) if scope.allows(o))
        self._scope_cache[scope] = owners
        while len(self._scope_cache) > _SCOPE_CACHE_SIZE:
            self._scope_cache.popitem(last=False)
        return owners

    def search_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        probes = validate_probes(probes)
        scope = Scope.coerce(scope)
        if not probes:
            return []
        with self._lock:  # the snapshot; rows below each view's n never change afterwards
            views = [v for v in (self._blocks[o].view() for o in self._owners_for(scope)) if v.n]
        if not views:
            return [[] for _ in probes]
        queries = np.asarray(self.embedder.embed(probes), dtype=np.float32)
        parts = [queries @ v.vectors[: v.n].T for v in views]  # views: no copy of any owner's rows
        scores = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        starts = np.cumsum([0] + [v.n for v in views])
        total = int(starts[-1])
        k = min(params.top_k, total)
        results: list[list[Hit]] = []
        for p in range(len(probes)):
            row_scores = scores[p]
            top = np.argpartition(-row_scores, k - 1)[:k] if k < total else np.arange(total)
            top = top[np.argsort(-row_scores[top], kind="stable")]
            owner_of = np.searchsorted(starts, top, side="right") - 1 if len(views) > 1 else np.zeros_like(top)
            row_of = top - starts[owner_of]
            hits: list[Hit] = []
            for rank, (score, which, row) in enumerate(
                zip(row_scores[top].tolist(), owner_of.tolist(), row_of.tolist(), strict=True)
            ):
                if score < params.min_score:
                    break
                view = views[which]
                fact = view.facts[row]
                hits.append(Hit(fact=fact, score=score, rank=rank))
                if params.window:
                    hits.extend(_neighbours(view, fact, params.window, rank))
            results.append(hits)
        return results

    # ------------------------------------------------------------------ files

    def save(self, path: str | Path) -> Path:
        """Write every fact and vector to one file (a zip holding JSON and a numpy array).

        Crash- and race-safe: under a :class:`~pgr_core.stores._filelock.StoreLock` on the path, the store is
        written to a fresh temporary file beside it, synced, and moved onto the path in one step, so a
        reader always finds a complete old or new file, and a killed save leaves the old one.
        """
        path = Path(path)
        if path.is_dir():
            raise ConfigurationError(
                f"{path} is a directory; save the store to a file path such as {path / 'memory.pgr'}"
            )
        meta = {"format": _FORMAT, "embedder": self.embedder.name, "dim": self.embedder.dim}
        with StoreLock(path, what="InMemoryStore.save"):
            # a store that loaded this file refuses to overwrite another process's save of it; one that
            # never read it replaces it whole, as before (last writer wins)
            key = str(path.resolve())
            known = self._files.get(key)
            if known is not None and path.exists() and _signature(path) != known:
                raise ConfigurationError(
                    f"{path} changed since this store loaded or saved it (another process saved it): saving "
                    "would drop that process's facts. Load the file again, add your facts, and save; or save "
                    "to another path. Several processes share one memory through EdgeStore or a Qdrant server"
                )
            with self._lock:
                views = [b.view() for b in self._blocks.values()]
            _remove_stale_temporaries(path)  # left by a save that was killed; none runs now (the lock)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            try:
                with os.fdopen(fd, "w+b") as fh:
                    os.fchmod(fh.fileno(), stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o644)
                    _write_archive(fh, meta, views, self.embedder.dim)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, path)  # atomic: readers see the old file or the new one, never a part
            except BaseException:
                with suppress(OSError):
                    os.unlink(tmp)
                raise
            _fsync_directory(path.parent)
            if key in self._files:  # a file this store read: its next save compares against this one
                self._files[key] = _signature(path)
        return path

    @classmethod
    def load(cls, path: str | Path, embedder: Embedder | None = None) -> InMemoryStore:
        """Read a file written by :meth:`save`. The embedder must be the one that wrote it.

        Anything wrong with the file is a :class:`~pgr_core.errors.ConfigurationError` naming the file
        and what is wrong (the damaged part, the bad line, the missing key)."""
        path = Path(path)
        if path.is_dir():
            raise ConfigurationError(
                f"{path} is a directory, not a pgr store file; pass the path of the file save() wrote"
            )
        if not path.exists():
            raise ConfigurationError(f"no store file at {path}; create one with `pgr demo --save-store {path}`")
        signature = _signature(path)  # before reading: a save that lands meanwhile changes it
        meta, lines, vectors = _read_archive(path)
        store = cls(embedder=embedder)
        _check_meta(path, meta, store.embedder)
        facts = [_fact_at(path, number, line) for number, line in enumerate(lines, 1) if line.strip()]
        vectors = _checked_vectors(path, vectors, facts, store.embedder.dim)
        try:
            store._write(facts, vectors)
        except InvalidArgumentError as exc:
            raise ConfigurationError(f"{path}: {exc}; {_DAMAGED}") from exc
        store._files[str(path.resolve())] = signature
        return store


# ---------------------------------------------------------------------- helpers


def _signature(path: Path) -> tuple[int, int, int]:
    """What changes when any save replaces the file: save() moves a new file (a new inode) onto it."""
    st = path.stat()
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _keys(scope: Scope) -> list[tuple[str, str]]:
    return [(name, value) for name in _FIELDS if (value := getattr(scope, name)) is not None]


def _dated(fact: Fact) -> bool:
    return fact.date is not None or fact.updated_at is not None


def _neighbours(view: _View, fact: Fact, window: int, rank: int) -> list[Hit]:
    """The ±window turns of ``fact``'s session, from the same snapshot as the search (same owner only)."""
    if fact.session_id is None or fact.position is None:
        return []
    out = []
    for offset in [d for w in range(1, window + 1) for d in (-w, w)]:
        row = view.turns.get((fact.session_id, fact.position + offset))
        if row is not None and row < view.n:  # a turn appended after the snapshot is not in it
            out.append(Hit(fact=view.facts[row], score=0.0, rank=rank, neighbour_of=fact.id))
    return out


def _nonfinite_row(vectors: np.ndarray) -> int | None:
    """The first row holding NaN or an infinity, or None."""
    for start in range(0, len(vectors), 65536):  # bounded temporary memory on a large store
        finite = np.isfinite(vectors[start : start + 65536]).all(axis=1)
        if not finite.all():
            return start + int(np.argmin(finite))
    return None


def _write_archive(fh: Any, meta: Mapping[str, Any], views: list[_View], dim: int) -> None:
    """The zip: meta.json, facts.jsonl (one JSON object a line), vectors.npy (rows in facts order).
    The vectors are streamed owner by owner, stored uncompressed (random floats do not deflate)."""
    total = sum(v.n for v in views)
    with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("meta.json", json.dumps(meta))
        lines = (json.dumps(f.to_dict(), ensure_ascii=False) for v in views for f in v.facts[: v.n])
        zf.writestr("facts.jsonl", "\n".join(lines))
        info = zipfile.ZipInfo("vectors.npy", date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_STORED
        big = total * dim * 4 > 2**31 - 2**24
        with zf.open(info, "w", force_zip64=big) as out:
            header = {
                "descr": np.lib.format.dtype_to_descr(np.dtype("<f4")),
                "fortran_order": False,
                "shape": (total, dim),
            }
            np.lib.format.write_array_header_1_0(out, header)
            for v in views:
                out.write(np.ascontiguousarray(v.vectors[: v.n], dtype="<f4").data.cast("B"))


_TEMPORARY = r"\.{name}\.[A-Za-z0-9_]{{8}}\.tmp"


def _remove_stale_temporaries(path: Path) -> None:
    pattern = re.compile(_TEMPORARY.format(name=re.escape(path.name)))
    with suppress(OSError):
        for entry in os.scandir(path.parent):
            if pattern.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                with suppress(OSError):
                    os.unlink(entry.path)


def _fsync_directory(directory: Path) -> None:
    """The rename itself survives a power cut only once the directory is synced (POSIX)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _read_archive(path: Path) -> tuple[Any, list[str], Any]:
    """meta, the fact lines and the vector array; a damaged part is a ConfigurationError naming it."""
    try:
        zf = zipfile.ZipFile(path)
    except IsADirectoryError:
        raise ConfigurationError(f"{path} is a directory, not a pgr store file") from None
    except PermissionError as exc:
        raise ConfigurationError(f"cannot read {path} ({exc.strerror}); check the file's permissions") from None
    except Exception as exc:  # zipfile fails in many ways on a file that is not a zip (BadZipFile, OSError...)
        raise ConfigurationError(
            f"{path} is not a pgr store file (not a readable zip archive: {exc}); {_DAMAGED}"
        ) from exc
    with zf:
        missing = [name for name in ("meta.json", "facts.jsonl", "vectors.npy") if name not in zf.namelist()]
        if missing:
            raise ConfigurationError(f"{path} is not a pgr store file: it lacks {', '.join(missing)}; {_DAMAGED}")
        meta = _member(path, "meta.json", lambda: json.loads(zf.read("meta.json").decode("utf-8")))
        text = _member(path, "facts.jsonl", lambda: zf.read("facts.jsonl").decode("utf-8"))
        vectors = _member(path, "vectors.npy", lambda: _read_vectors(zf))
    return meta, text.split("\n"), vectors  # not splitlines(): U+2028 inside a fact's text is no line end


def _read_vectors(zf: zipfile.ZipFile) -> np.ndarray:
    with zf.open("vectors.npy") as fh:
        vectors = np.load(fh, allow_pickle=False)
        if fh.read(1):
            raise ValueError("bytes after the array")
    return vectors  # type: ignore[no-any-return]


def _member(path: Path, name: str, read: Any) -> Any:
    try:
        return read()
    except Exception as exc:  # a damaged member fails in zipfile, zlib, json or numpy: all mean the same
        raise ConfigurationError(f"{name} in {path} is damaged ({type(exc).__name__}: {exc}); {_DAMAGED}") from exc


def _check_meta(path: Path, meta: Any, embedder: Embedder) -> None:
    if not isinstance(meta, dict):
        raise ConfigurationError(f"{path}: meta.json holds a JSON {type(meta).__name__}, not an object; {_DAMAGED}")
    missing = [key for key in _META_KEYS if key not in meta]
    if missing:
        raise ConfigurationError(f"{path}: meta.json lacks {', '.join(map(repr, missing))}; {_DAMAGED}")
    if meta["format"] != _FORMAT:
        raise ConfigurationError(
            f"{path}: unknown store format {meta['format']!r} (this pgr reads {_FORMAT!r}); open it with the "
            "pgr version that wrote it"
        )
    if meta["embedder"] != embedder.name:
        raise ConfigurationError(
            f"{path} was embedded with {meta['embedder']}, not {embedder.name}; load it with the same embedder"
        )
    dim = meta["dim"]
    if isinstance(dim, bool) or not isinstance(dim, int) or dim != embedder.dim:
        raise ConfigurationError(
            f"{path}: meta.json says dim {dim!r}, but the embedder {embedder.name} gives {embedder.dim}; {_DAMAGED}"
        )


def _fact_at(path: Path, number: int, line: str) -> Fact:
    where = f"{path}, facts.jsonl line {number}"
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise ConfigurationError(f"{where} is not valid JSON ({exc}); {_DAMAGED}") from None
    if not isinstance(data, dict):
        raise ConfigurationError(f"{where} is a JSON {type(data).__name__}, not an object; {_DAMAGED}")
    missing = [key for key in ("id", "text", "scope") if key not in data]
    if missing:
        raise ConfigurationError(f"{where} lacks {', '.join(map(repr, missing))}; {_DAMAGED}")
    try:
        return check_fact(_fact_from_dict(data), number - 1)
    except InvalidArgumentError as exc:  # ScopeError too
        raise ConfigurationError(f"{where}: {exc}; {_DAMAGED}") from None


def _checked_vectors(path: Path, vectors: Any, facts: list[Fact], dim: int) -> np.ndarray:
    if not isinstance(vectors, np.ndarray) or vectors.shape != (len(facts), dim):
        shape = getattr(vectors, "shape", None)
        raise ConfigurationError(
            f"{path}: vectors.npy holds an array of shape {shape}, but the file has {len(facts)} facts of "
            f"dimension {dim}, so ({len(facts)}, {dim}) was expected; {_DAMAGED}"
        )
    if vectors.dtype.kind not in "fiu":
        raise ConfigurationError(f"{path}: vectors.npy holds {vectors.dtype} values, not numbers; {_DAMAGED}")
    vectors = vectors.astype(np.float32, copy=False)
    bad = _nonfinite_row(vectors)
    if bad is not None:
        raise ConfigurationError(
            f"{path}: vectors.npy row {bad} (fact {facts[bad].id!r}) holds NaN or infinite values; {_DAMAGED}"
        )
    return vectors


def _fact_from_dict(data: Mapping[str, Any]) -> Fact:
    scope = data["scope"]
    if not isinstance(scope, Mapping):
        raise InvalidArgumentError(f'scope must be an object such as {{"user_id": "u1"}}, got {scope!r:.60}')
    metadata = data.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise InvalidArgumentError(f"metadata must be an object, got {type(metadata).__name__}")
    return Fact(
        id=data["id"],
        text=data["text"],
        scope=Scope.coerce(scope),
        type=data.get("type"),
        date=parse_date(data.get("date")),
        updated_at=parse_date(data.get("updated_at"), what="updated_at"),
        session_id=data.get("session_id"),
        position=data.get("position"),
        metadata=metadata or {},
    )
