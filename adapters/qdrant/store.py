"""Qdrant as a pgr store: an existing collection, searched one round trip per PGR round.

:class:`QdrantStore` wraps a collection as it is. It reads the collection's layout once (which vector
to query, which payload key holds the text, whether points carry a session and a position) and never
creates, re-indexes or rewrites anything on search. Each round of probes is one embedding call and
one ``query_batch_points`` call, with the caller's scope as a payload filter on every request; the
temporal window adds one ``scroll`` for the neighbours of that round's hits. Facts by id
(:meth:`QdrantStore.get_many`) and the window of given hits (:meth:`QdrantStore.with_window`), which
:class:`pgr_core.Anticipating` asks for the facts it found through their cues, are one ``scroll`` each,
under the same scope filter; every fact of a scope (:meth:`QdrantStore.facts_for`, what
``Anticipating.build`` backfills cues for) is a paged ``scroll`` under it.

Payload layout read (and written by :meth:`QdrantStore.upsert_facts`)::

    text_key ("text" when writing; found automatically when reading: data, text, content, ...)
    user_id / agent_id / run_id     the owner (names mapped by ``scope_fields``)
    date, created_at, updated_at    ISO dates (mem0 writes created_at / updated_at)
    session_id, position            the turn's place in its session (for the window)
    type, fact_id                   the fact's type; its pgr id when that is not the point id
    anything else                   Fact.metadata

Owners. The sampled points must name an owner under a mapped key: a collection whose points keep it
under another key (``owner``) is refused at wrap time, naming the keys seen, rather than searched empty
for every user; pass ``scope_fields={"user_id": "owner"}``, or ``single_tenant_scope=`` for a collection
that holds one tenant's data. Every request filters on the caller's scope, and every point that comes
back is checked again: it is returned only when each owner field it carries is a plain, non-blank
string and they are the caller's (Qdrant's keyword match matches a list by any element, so a point with
``user_id: ["alice", "bob"]`` answers both). Any other point is dropped, counted in ``out_of_scope_dropped`` and logged;
the rest of the search goes on. A fact id names one owner's point: :meth:`QdrantStore.upsert_facts`
refuses an id whose point another owner holds, and leaves that point as it was.

Dates. A payload date without a timezone is read as UTC (:func:`pgr_core._dates.read_stored_date`), so
every fact date this store returns is aware, and PGR reads a naive query date as UTC too: a collection
holding both kinds (mem0's stamps next to dates other writers left naive) is searched, never refused.

Hybrid. With ``sparse_vector=`` (a sparse vector of the collection holding BM25 of the text, best with
``Modifier.IDF``), each probe searches the dense vector (with τ) and BM25 (without τ), both under the
scope filter, fused by reciprocal rank in the same ``query_batch_points`` call, as
:class:`pgr_core.stores.edge.EdgeStore` does with ``hybrid=True``; writes add the BM25 document encoding.
BM25 is computed in-process by ``qdrant_edge.Bm25`` (qdrant-edge-py).

Sync and async. Each method that calls the client is written once, as a flow (:mod:`pgr_adapters._flows`)
that yields the client calls it needs by name (``_Call``); one driver makes them on a ``QdrantClient``,
the other awaits them on an ``AsyncQdrantClient``, so the sync and async methods never copy each other.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, ClassVar, TypeVar, cast

import numpy as np
from qdrant_client import AsyncQdrantClient, QdrantClient
from qdrant_client import models as qm
from qdrant_client.local.async_qdrant_local import AsyncQdrantLocal
from qdrant_client.local.qdrant_local import QdrantLocal

from pgr_core._dates import read_stored_date
from pgr_core.errors import ConfigurationError, InvalidArgumentError, PGRError, ScopeError, StoreError
from pgr_core.models.embedders import Embedder
from pgr_core.stores.contract import Store, validate_probes
from pgr_core.types import Capabilities, Fact, Hit, Scope, SearchParams, owner_fields

from .._flows import Flow, adrive, drive
from .._owners import owner_key_guess

__all__ = ["DEFAULT_SCOPE_FIELDS", "TEXT_KEYS", "CollectionLayout", "QdrantStore"]

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

#: pgr scope field -> payload key; mem0 stores its owner ids under these very names.
DEFAULT_SCOPE_FIELDS: Mapping[str, str] = {"user_id": "user_id", "agent_id": "agent_id", "run_id": "run_id"}
#: Payload keys tried, in order, for the text: mem0, common defaults, LangChain, fastembed, others.
TEXT_KEYS = ("data", "text", "content", "page_content", "document", "memory")
NODE_CONTENT = "_node_content"  # LlamaIndex keeps the serialised node (text included) under this key
FACT_ID_KEY = "fact_id"
UPDATED_AT_KEY = "updated_at"
TYPE_KEY = "type"
_LLAMA_BOOKKEEPING = (NODE_CONTENT, "_node_type")
_SAMPLE = 32  # points read to learn the payload layout
_UPSERT_CHUNK = 256
_LIST_PAGE = 256  # points per scroll page when listing a scope's facts (facts_for)
_INSTALL_BM25 = "pip install qdrant-edge-py (in pgr[local])"
# Fact ids that are neither UUIDs nor unsigned ints become UUID5s in this namespace.
_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://pgr/qdrant/fact-id")


@dataclass(frozen=True)
class CollectionLayout:
    """What :class:`QdrantStore` learned about a collection: the vector to query and the payload keys.

    ``text_key`` is ``None`` only while the collection is empty and no key was given.
    """

    vector_name: str | None  # None: the collection's single unnamed vector
    dim: int
    distance: qm.Distance
    text_key: str | None
    window: bool  # points carry session and position, so SearchParams.window works
    keys_seen: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Found:
    """A direct hit with the raw session/position payload values its neighbour filter needs."""

    hit: Hit
    session: Any
    position: int | None


class QdrantStore(Store):
    """An existing Qdrant collection as a pgr :class:`~pgr_core.stores.contract.Store`.

    >>> client = QdrantClient(url="http://localhost:6333")          # doctest: +SKIP
    >>> store = QdrantStore(client, "memories", embedder=MiniLMEmbedder())  # doctest: +SKIP
    >>> PGR(store).retrieve("Should I join a league?", scope=Scope(user_id="alice"))  # doctest: +SKIP

    - ``client``: a ``QdrantClient`` or ``AsyncQdrantClient``, local (``":memory:"``, ``path=``) or by URL.
    - ``embedder``: the embedder that filled the collection (its ``dim`` must match the vector's size).
    - ``text_key`` / ``vector_name``: found from the collection when not given (a single named or
      unnamed dense vector; the first of :data:`TEXT_KEYS` or LlamaIndex's ``_node_content`` found
      in a sample of points). :class:`ConfigurationError` says what was tried when that fails.
    - ``scope_fields``: pgr scope field -> payload key (default: the same names). A scope that sets
      a field with no key mapped raises :class:`ScopeError`; pgr never searches with a looser filter.
      When none of the sampled points carries any of these keys, :class:`ConfigurationError` names the
      keys they do carry (pass ``scope_fields={"user_id": "owner"}``); when only some do, the others are
      nobody's (a search never returns them) and a warning says how many.
    - ``single_tenant_scope``: ``Scope(...)`` for a collection that holds one tenant's data only, whose
      points need name no owner: searches for exactly that scope run without an owner filter (a point
      naming another owner is still dropped), any other scope raises :class:`ScopeError`, and writes
      must be that scope's.
    - ``session_key`` / ``position_key``: payload keys placing a turn in its session. ``window``:
      ``None`` detects them in the sampled points; ``True`` / ``False`` declares it.
    - ``date_keys``: payload keys tried, in order, for the fact's date.

    Sync and async: with a ``QdrantClient``, :meth:`asearch_batch` runs the sync search in a thread.
    With an ``AsyncQdrantClient``, :meth:`asearch_batch` awaits it natively; the sync methods run it to
    completion on a private event loop when the client is local, and raise ``ConfigurationError`` when
    it is remote (its connections belong to the loop that opened them: use ``PGR.aretrieve``, or pass a
    ``QdrantClient`` for sync use). A remote async client's layout is read on the first async call,
    or by ``await store.ainspect()``.

    - ``sparse_vector``: the name of the collection's sparse vector holding BM25 of the text (for
      instance ``"bm25"``, with ``modifier=Modifier.IDF``); set, searches are hybrid (below) and
      :meth:`upsert_facts` writes it too. The collection must have it (:class:`ConfigurationError`
      names the sparse vectors it has); BM25 comes from ``qdrant_edge.Bm25`` (``pip install
      qdrant-edge-py``, in ``pgr[local]``). Nothing else of the collection changes.

    Scores are the collection's own: cosine similarities for a Cosine collection
    (``capabilities.cosine_scores``); dot products for Dot; minus the distance for Euclid and
    Manhattan, where τ (``min_score``) is not applied because it is defined on cosine.

    Hybrid (``sparse_vector=...``): each probe is one request of the round's ``query_batch_points``
    call, with two prefetches under the same scope filter, the dense vector with ``score_threshold``
    = τ and BM25 of the probe without one (``top_k`` each), fused by reciprocal rank
    (``FusionQuery(fusion=Fusion.RRF)``), ``top_k`` kept. Scores are then RRF scores (on Qdrant's
    default constant, at most 1.0 for a point first on both sides), not cosines: such an instance
    declares ``capabilities.cosine_scores = False``, and τ only filters the dense side, so an exact
    keyword match comes back even when its cosine is below τ. A probe with no BM25 term (stopwords
    only) is fused over its dense side alone.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(writable=True, dates=True, lists=True, by_id=True)
    #: Payload dates without a timezone are read as UTC; PGR reads a naive query date so too.
    naive_dates_are_utc: ClassVar[bool] = True

    def __init__(
        self,
        client: QdrantClient | AsyncQdrantClient,
        collection: str,
        *,
        embedder: Embedder,
        text_key: str | None = None,
        vector_name: str | None = None,
        scope_fields: Mapping[str, str] | None = None,
        session_key: str = "session_id",
        position_key: str = "position",
        date_keys: Sequence[str] = ("date", "created_at"),
        window: bool | None = None,
        sparse_vector: str | None = None,
        single_tenant_scope: Scope | Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(client, QdrantClient | AsyncQdrantClient):
            raise ConfigurationError(
                f"client must be a qdrant_client.QdrantClient or AsyncQdrantClient, not {type(client).__name__}"
            )
        if not isinstance(collection, str) or not collection:
            raise ConfigurationError(f"collection must be a non-empty collection name, got {collection!r}")
        if embedder is None or not hasattr(embedder, "embed") or not hasattr(embedder, "dim"):
            raise ConfigurationError("QdrantStore needs the embedder that filled the collection: embedder=...")
        self.client = client
        self.collection = collection
        self.embedder = embedder
        self.scope_fields = _check_scope_fields(scope_fields)
        self.single_tenant_scope = Scope.coerce(single_tenant_scope) if single_tenant_scope is not None else None
        self.session_key = session_key
        self.position_key = position_key
        self.date_keys = tuple(date_keys)
        self._text_key = text_key
        self._vector_name = vector_name
        self._declared_window = window
        if sparse_vector is not None and (not isinstance(sparse_vector, str) or not sparse_vector):
            raise ConfigurationError(
                f"sparse_vector must be the name of the collection's BM25 sparse vector, got {sparse_vector!r}"
            )
        self.sparse_vector = sparse_vector
        self._bm25: Any = _bm25_model() if sparse_vector else None
        self._async = isinstance(client, AsyncQdrantClient)
        self._local = isinstance(getattr(client, "_client", None), QdrantLocal | AsyncQdrantLocal)
        self._layout: CollectionLayout | None = None
        self.capabilities = Capabilities(  # type: ignore[misc]
            writable=True, dates=True, native_async=self._async, lists=True, by_id=True
        )
        self.out_of_scope_dropped = 0  # points a search dropped: their owner fields were not plainly the caller's
        self._count_lock = threading.Lock()
        if not self._async or self._local:
            self.inspect()  # learn the layout now, so set-up errors surface at construction

    def __repr__(self) -> str:
        return f"QdrantStore(collection={self.collection!r}, layout={self._layout!r})"

    # ================================================================== the collection's layout

    @property
    def layout(self) -> CollectionLayout:
        if self._layout is None:
            raise ConfigurationError(
                "the collection's layout is not read yet (remote async client): await store.ainspect() "
                "or make an async call first"
            )
        return self._layout

    def inspect(self) -> CollectionLayout:
        """Read the collection's config and a sample of points; returns (and keeps) the layout."""
        return self._run(self._inspect_flow())

    async def ainspect(self) -> CollectionLayout:
        """Async twin of :meth:`inspect`."""
        return await self._arun(self._inspect_flow())

    def _inspect_flow(self) -> Flow[CollectionLayout]:
        with self._backend("reading the collection"):
            info = yield _Call.of("get_collection", self.collection)
            records, _ = yield _Call.of("scroll", self.collection, limit=_SAMPLE, with_payload=True)
        return self._set_layout(self._read_layout(info, records))

    def _layout_flow(self) -> Flow[CollectionLayout]:
        """The layout to search and read by: the one kept, read again while the collection was empty."""
        return self._known_layout() or (yield from self._inspect_flow())

    def _known_layout(self) -> CollectionLayout | None:
        """The layout kept, unless it is of a collection that was empty (no text key yet) or not read."""
        return self._layout if self._layout is not None and self._layout.text_key is not None else None

    def _read_layout(self, info: Any, records: Sequence[Any]) -> CollectionLayout:
        vector_name, params = self._pick_vector(info.config.params.vectors)
        if params.size != self.embedder.dim:
            raise ConfigurationError(
                f"collection {self.collection!r} holds {params.size}-dim vectors"
                f"{f' under {vector_name!r}' if vector_name else ''}, but the embedder "
                f"{getattr(self.embedder, 'name', type(self.embedder).__name__)} gives {self.embedder.dim}: "
                "pass the embedder that filled the collection"
            )
        if self.sparse_vector is not None:
            self._check_sparse(info.config.params.sparse_vectors)
        payloads = [r.payload or {} for r in records]
        seen = tuple(sorted({k for p in payloads for k in p}))
        text_key = self._pick_text_key(payloads, seen)
        self._check_owner_keys(payloads, seen, text_key)
        if self._declared_window is not None:
            window = self._declared_window
        else:
            window = any(self.session_key in p and self.position_key in p for p in payloads)
        return CollectionLayout(vector_name, params.size, params.distance, text_key, window, seen)

    def _pick_vector(self, vectors: Any) -> tuple[str | None, Any]:
        if isinstance(vectors, qm.VectorParams):  # one unnamed vector
            if self._vector_name:
                raise ConfigurationError(
                    f"collection {self.collection!r} has one unnamed vector, not {self._vector_name!r}: "
                    "leave vector_name unset"
                )
            return None, vectors
        named = dict(vectors or {})
        if self._vector_name is not None:
            if self._vector_name not in named:
                raise ConfigurationError(
                    f"collection {self.collection!r} has no vector named {self._vector_name!r}; "
                    f"its vectors are {sorted(named)}"
                )
            return self._vector_name, named[self._vector_name]
        if "" in named and len(named) == 1:
            return None, named[""]
        if len(named) == 1:
            return next(iter(named.items()))
        if not named:
            raise ConfigurationError(f"collection {self.collection!r} has no dense vector to search")
        raise ConfigurationError(
            f"collection {self.collection!r} has several named vectors {sorted(named)}; choose one with vector_name=..."
        )

    def _check_sparse(self, sparse: Any) -> None:
        named = dict(sparse or {})
        if self.sparse_vector not in named:
            raise ConfigurationError(
                f"collection {self.collection!r} has no sparse vector named {self.sparse_vector!r}; its sparse "
                f"vectors are {sorted(named)}: pass sparse_vector=<one of them>, or leave it unset for dense search"
            )
        if getattr(named[self.sparse_vector], "modifier", None) != qm.Modifier.IDF:
            logger.warning(
                "sparse vector %r of collection %r has no IDF modifier: BM25 scores leave out term rarity",
                self.sparse_vector,
                self.collection,
            )

    def _pick_text_key(self, payloads: list[dict[str, Any]], seen: tuple[str, ...]) -> str | None:
        if not payloads:  # an empty collection: writes will use "text" unless told otherwise
            return self._text_key
        if self._text_key is not None:
            if not any(_text_of(p, self._text_key) for p in payloads):
                raise ConfigurationError(
                    f"no text under payload key {self._text_key!r} in {len(payloads)} sampled points of "
                    f"collection {self.collection!r}; their keys are {list(seen)}: pass text_key=<one of them>"
                )
            return self._text_key
        for key in (*TEXT_KEYS, NODE_CONTENT):
            if any(_text_of(p, key) for p in payloads):
                return key
        raise ConfigurationError(
            f"cannot tell which payload key of collection {self.collection!r} holds the text: tried "
            f"{[*TEXT_KEYS, NODE_CONTENT + ' (LlamaIndex JSON)']} on {len(payloads)} sampled points, whose "
            f"keys are {list(seen)}; pass text_key=..."
        )

    def _check_owner_keys(self, payloads: list[dict[str, Any]], seen: tuple[str, ...], text_key: str | None) -> None:
        """Refuse a collection none of whose sampled points names an owner under a mapped key: every
        search of it would come back empty, for every user. Points without one are nobody's."""
        if not payloads or self.single_tenant_scope is not None:
            return  # nothing to sample yet, or the whole collection is the one tenant's
        keys = list(dict.fromkeys(self.scope_fields.values()))
        unowned = sum(1 for p in payloads if all(p.get(k) is None for k in keys))
        if unowned == len(payloads):
            raise ConfigurationError(
                f"none of the {len(payloads)} sampled points of collection {self.collection!r} names an owner "
                f"under the payload keys this store filters on {keys}, so every search would come back empty; "
                f"their keys are {list(seen)}. Map the key that holds the owner, e.g. "
                f'scope_fields={{"user_id": "{owner_key_guess(seen, text_key)}"}}, or, if the collection '
                "holds one tenant's data only, pass single_tenant_scope=Scope(user_id=...)"
            )
        if unowned:
            logger.warning(
                "%d of %d sampled points of collection %r carry none of the owner keys %s: no scope sees them",
                unowned,
                len(payloads),
                self.collection,
                keys,
            )

    def _set_layout(self, layout: CollectionLayout) -> CollectionLayout:
        self._layout = layout
        self.capabilities = Capabilities(  # type: ignore[misc]
            writable=True,
            dates=True,
            # hybrid scores are reciprocal-rank fusions, not cosines
            cosine_scores=layout.distance == qm.Distance.COSINE and self.sparse_vector is None,
            window=layout.window,
            native_async=self._async,
            lists=True,  # facts_for
            by_id=True,  # get, get_many
        )
        return layout

    # ================================================================== searching

    def search_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        """One embedding call and one ``query_batch_points`` call for every probe (plus one ``scroll``
        for the neighbours when ``params.window`` > 0 and the collection keeps turn order)."""
        return self._run(self._search_flow(probes, scope, params))

    async def asearch_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        """Async twin of :meth:`search_batch`: native with an ``AsyncQdrantClient``, a thread otherwise."""
        return await self._arun(self._search_flow(probes, scope, params))

    def _search_flow(self, probes: Sequence[str], scope: Scope, params: SearchParams) -> Flow[list[list[Hit]]]:
        probes, scope, condition = self._prepare(probes, scope)
        if not probes:
            return []
        layout = yield from self._layout_flow()
        if layout.text_key is None:  # still empty
            return [[] for _ in probes]
        vectors = yield _Work(self.embedder.embed, (probes,))
        requests = self._requests(probes, vectors, condition, params)
        with self._backend("query_batch_points"):
            responses = yield _Call.of("query_batch_points", self.collection, requests=requests)
        direct = self._direct(responses, scope)
        neighbours = self._neighbour_filter(direct, condition, params.window)
        records = []
        if neighbours is not None:
            records = yield from self._scroll_flow(*neighbours, what="scroll (window)")
        return self._assemble(direct, records, params.window if neighbours else 0, scope)

    # -- facts by id, and the window of given hits (what pgr_core.Anticipating asks of a store)

    def get_many(self, fact_ids: Sequence[str], *, scope: Scope | Mapping[str, str]) -> dict[str, Fact]:
        """fact id -> fact for those of ``fact_ids`` that ``scope`` may see, built as a search builds its
        hits (:meth:`fact_from_payload`); unknown ids and other owners' points are left out.

        One ``scroll`` (paged only past a page of matches) whose filter is the scope's conditions AND
        the ids, as point ids (:meth:`point_id`, for points pgr wrote or keyed by their fact id) or as
        the ``fact_id`` payload key. The points that come back pass the owner check a search makes."""
        scope = Scope.coerce(scope)
        wanted = list(dict.fromkeys(str(i) for i in fact_ids))
        condition = self.scope_conditions(scope)
        if not wanted:
            return {}
        layout = self._known_layout() or self.inspect()
        if layout.text_key is None:  # an empty collection
            return {}
        by_id = qm.Filter(
            should=[
                qm.HasIdCondition(has_id=list(dict.fromkeys(self.point_id(i) for i in wanted))),
                qm.FieldCondition(key=FACT_ID_KEY, match=qm.MatchAny(any=wanted)),
            ]
        )
        flt = qm.Filter(must=[*condition, by_id])
        records = self._run(self._scroll_flow(flt, max(64, 2 * len(wanted)), what="scroll (facts by id)"))
        found: dict[str, Fact] = {}
        for record in self._visible(records, scope):
            fact = self.fact_from_payload(record.id, record.payload or {})
            found.setdefault(fact.id, fact)
        return {i: found[i] for i in wanted if i in found}  # in the order asked

    def get(self, fact_id: str, *, scope: Scope | Mapping[str, str]) -> Fact | None:
        """The fact ``fact_id`` if ``scope`` may see it, else None: :meth:`get_many` of that one id."""
        return self.get_many([fact_id], scope=scope).get(str(fact_id))

    def facts_for(self, scope: Scope | Mapping[str, str]) -> list[Fact]:
        """Every fact ``scope`` may see, built as a search builds its hits (:meth:`fact_from_payload`):
        what :meth:`pgr_core.Anticipating.build` backfills cues for. Reads only; nothing is written.

        A paged ``scroll`` whose filter is the scope's conditions (the filter every search carries),
        in point-id order. The points that come back pass the owner check a search makes: one whose
        owner fields are not plainly the caller's (a list, a number) is dropped, counted in
        ``out_of_scope_dropped`` and logged. A point with no text under the layout's text key is no
        fact to show, and is left out too."""
        scope = Scope.coerce(scope)
        condition = self.scope_conditions(scope)
        layout = self._known_layout() or self.inspect()
        if layout.text_key is None:  # an empty collection
            return []
        flt = qm.Filter(must=list(condition))
        records = self._run(self._scroll_flow(flt, _LIST_PAGE, what="scroll (facts of a scope)"))
        found: dict[str, Fact] = {}
        for record in self._visible(records, scope):
            fact = self.fact_from_payload(record.id, record.payload or {})
            if fact.text.strip():
                found.setdefault(fact.id, fact)
        return list(found.values())

    def with_window(
        self, hits: Sequence[Hit], *, scope: Scope | Mapping[str, str], window: int
    ) -> dict[str, list[Hit]]:
        """The ±window same-session neighbours of each hit's fact, as a search's window brings them
        (same owner and session, nearest first): fact id -> neighbour hits. One ``scroll`` under the
        scope for all of them; nothing when the collection keeps no turn order."""
        scope = Scope.coerce(scope)
        condition = self.scope_conditions(scope)
        if window < 1 or not self.capabilities.window:
            return {}
        anchors = list({h.fact.id: h for h in hits if h.neighbour_of is None}.values())
        found = [_Found(h, h.fact.session_id, h.fact.position) for h in anchors]
        # a Fact's session id is the payload value as a string: ask for an integer session id too
        as_int = [
            _Found(f.hit, int(f.session), f.position)
            for f in found
            if isinstance(f.session, str) and f.session.isascii() and f.session.isdigit()
        ]
        neighbours = self._neighbour_filter([found + as_int], condition, window)
        if neighbours is None:
            return {}
        records = self._run(self._scroll_flow(*neighbours, what="scroll (window)"))
        out: dict[str, list[Hit]] = {}
        for hit in self._assemble([found], records, window, scope)[0]:
            if hit.neighbour_of is not None:
                out.setdefault(hit.neighbour_of, []).append(hit)
        return out

    def _scroll_flow(self, flt: qm.Filter, limit: int, *, what: str) -> Flow[list[Any]]:
        """Every point ``flt`` matches, with payloads: one ``scroll`` page unless more match."""
        records: list[Any] = []
        offset = None
        with self._backend(what):
            while True:
                page, offset = yield _Call.of(
                    "scroll", self.collection, scroll_filter=flt, limit=limit, offset=offset, with_payload=True
                )
                records.extend(page)
                if offset is None:
                    return records

    # -- the steps of one search, shared by the sync and async paths

    def _prepare(self, probes: Sequence[str], scope: Scope) -> tuple[list[str], Scope, list[qm.Condition]]:
        scope = Scope.coerce(scope)
        return validate_probes(probes), scope, self.scope_conditions(scope)

    def scope_conditions(self, scope: Scope) -> list[qm.Condition]:
        """The payload conditions every request carries: one ``MatchValue`` per set scope field (none
        under ``single_tenant_scope``, whose whole collection is that scope's).

        Raises :class:`ScopeError` when the scope sets a field that no payload key is mapped to, or is
        not the single tenant's."""
        tenant = self.single_tenant_scope
        if tenant is not None:
            if scope != tenant:
                raise ScopeError(
                    f"this QdrantStore holds only the data of {tenant.as_dict()} (single_tenant_scope); it "
                    f"cannot answer for {scope.as_dict()}. To serve several scopes, wrap the collection without "
                    "single_tenant_scope, with scope_fields naming its owner keys"
                )
            return []
        conditions: list[qm.Condition] = []
        for field, value in scope.as_dict().items():
            key = self.scope_fields.get(field)
            if key is None:
                raise ScopeError(
                    f"the scope sets {field}={value!r}, but this QdrantStore maps no payload key to {field} "
                    f"(scope_fields={dict(self.scope_fields)}); add scope_fields[{field!r}]=<payload key> or "
                    f"drop {field} from the scope. pgr never searches with a looser filter."
                )
            conditions.append(qm.FieldCondition(key=key, match=qm.MatchValue(value=value)))
        return conditions

    def _requests(
        self, probes: Sequence[str], vectors: np.ndarray, condition: list[qm.Condition], params: SearchParams
    ) -> list[Any]:
        layout = self.layout
        # τ is a cosine floor: meaningful for Cosine (and Dot on unit vectors), not for distances
        threshold = params.min_score if layout.distance in (qm.Distance.COSINE, qm.Distance.DOT) else None
        if self.sparse_vector is not None:
            return [
                self._hybrid_request(probe, vector, condition, params, threshold)
                for probe, vector in zip(probes, vectors, strict=True)
            ]
        return [
            qm.QueryRequest(
                query=np.asarray(vector, dtype=np.float32).tolist(),
                using=layout.vector_name,
                filter=qm.Filter(must=list(condition)),
                limit=params.top_k,
                score_threshold=threshold,
                with_payload=True,  # QueryRequest's default (None) returns no payload at all
            )
            for vector in vectors
        ]

    def _hybrid_request(
        self,
        probe: str,
        vector: np.ndarray,
        condition: list[qm.Condition],
        params: SearchParams,
        threshold: float | None,
    ) -> qm.QueryRequest:
        """Dense (τ) and BM25 (no τ) prefetches, each under the scope filter, fused by RRF."""
        prefetch = [
            qm.Prefetch(
                query=np.asarray(vector, dtype=np.float32).tolist(),
                using=self.layout.vector_name,
                filter=qm.Filter(must=list(condition)),
                limit=params.top_k,
                score_threshold=threshold,
            )
        ]
        terms = _sparse(self._bm25.embed_query(probe))
        if terms is not None:  # a probe of stopwords only has no BM25 side
            prefetch.append(
                qm.Prefetch(
                    query=terms, using=self.sparse_vector, filter=qm.Filter(must=list(condition)), limit=params.top_k
                )
            )
        return qm.QueryRequest(
            prefetch=prefetch,
            query=qm.FusionQuery(fusion=qm.Fusion.RRF),
            filter=qm.Filter(must=list(condition)),  # the fused level is scoped too
            limit=params.top_k,
            with_payload=True,
        )

    def _direct(self, responses: Sequence[Any], scope: Scope) -> list[list[_Found]]:
        distance = self.layout.distance in (qm.Distance.EUCLID, qm.Distance.MANHATTAN)
        sign = -1.0 if distance and self.sparse_vector is None else 1.0  # RRF scores: higher is better
        out = []
        for response in responses:
            found: list[_Found] = []
            for point in self._visible(response.points, scope):
                payload = point.payload or {}
                fact = self.fact_from_payload(point.id, payload)
                hit = Hit(fact=fact, score=sign * float(point.score), rank=len(found))
                found.append(_Found(hit, payload.get(self.session_key), _position(payload.get(self.position_key))))
            out.append(found)
        return out

    def owner_of(self, payload: Mapping[str, Any]) -> Scope | None:
        """The owner a point names: its scope fields, each a plain string (a blank one names nothing).
        ``None`` when it names none, or names one ambiguously (a list, a number, a mapping: Qdrant's
        keyword match matches a list by any element, so such a point would answer to several owners).
        Under ``single_tenant_scope`` the fields a point leaves out are the tenant's."""
        owner = self._owner_fields(payload)
        return Scope(**owner) if owner else None

    def _owner_fields(self, payload: Mapping[str, Any]) -> dict[str, str] | None:
        owner = owner_fields(payload, self.scope_fields)
        return None if owner is None else self._with_tenant(owner)

    def _with_tenant(self, owner: dict[str, str]) -> dict[str, str]:
        """``owner`` with the fields it leaves out taken from ``single_tenant_scope``, if any: the
        collection vouches for the rest."""
        tenant = self.single_tenant_scope
        return owner if tenant is None else {**tenant.as_dict(), **owner}

    def _visible(self, points: Sequence[Any], scope: Scope) -> list[Any]:
        """The points ``scope`` may see; the others are dropped, counted and logged, never an error."""
        kept = []
        for point in points:
            owner = self.owner_of(point.payload or {})
            if owner is not None and scope.allows(owner):
                kept.append(point)
                continue
            with self._count_lock:
                self.out_of_scope_dropped += 1
            logger.warning(
                "dropped point %s of collection %r: its owner fields are not plainly those of scope %s",
                point.id,
                self.collection,
                scope.as_dict(),
            )
        return kept

    def _neighbour_filter(
        self, direct: list[list[_Found]], condition: list[qm.Condition], window: int
    ) -> tuple[qm.Filter, int] | None:
        """One filter for every neighbour of this round's hits: the scope, and per session the
        positions within ±window of an anchor."""
        if not window or not self.capabilities.window:
            return None
        wanted: dict[Any, set[int]] = {}
        for found in (f for lst in direct for f in lst):
            if found.session is None or found.position is None or not isinstance(found.session, str | int):
                continue
            positions = wanted.setdefault(found.session, set())
            for d in range(1, window + 1):
                positions.update(p for p in (found.position - d, found.position + d) if p >= 0)
        if not wanted:
            return None
        per_session: list[qm.Condition] = [
            qm.Filter(
                must=[
                    qm.FieldCondition(key=self.session_key, match=qm.MatchValue(value=session)),
                    qm.FieldCondition(key=self.position_key, match=qm.MatchAny(any=sorted(positions))),
                ]
            )
            for session, positions in wanted.items()
        ]
        flt = qm.Filter(must=[*condition, qm.Filter(should=per_session)])
        # room for a few owners sharing a session id, so one page is the rule
        return flt, max(64, 4 * sum(len(p) for p in wanted.values()))

    def _assemble(
        self, direct: list[list[_Found]], records: Sequence[Any], window: int, scope: Scope
    ) -> list[list[Hit]]:
        """Each direct hit followed by its ±window neighbours of the same owner and session, nearest
        first (-1, +1, -2, +2, ...), as ``pgr_core.stores.memory`` does."""
        turns: dict[tuple[Scope, str, int], Fact] = {}
        for record in self._visible(records, scope):
            fact = self.fact_from_payload(record.id, record.payload or {})
            if fact.session_id is not None and fact.position is not None:
                turns.setdefault((fact.scope, fact.session_id, fact.position), fact)
        out = []
        for found_list in direct:
            hits: list[Hit] = []
            for found in found_list:
                hits.append(found.hit)
                anchor = found.hit.fact
                if not window or anchor.session_id is None or anchor.position is None:
                    continue
                for offset in (d for w in range(1, window + 1) for d in (-w, w)):
                    neighbour = turns.get((anchor.scope, anchor.session_id, anchor.position + offset))
                    if neighbour is not None:
                        hits.append(Hit(fact=neighbour, score=0.0, rank=found.hit.rank, neighbour_of=anchor.id))
            out.append(hits)
        return out

    # -- a point's payload as a Fact

    def fact_from_payload(self, point_id: Any, payload: Mapping[str, Any]) -> Fact:
        """The Fact a point stands for: text, owner, dates, session/position, type, the rest as metadata."""
        text_key = self.layout.text_key or "text"
        # plain strings only: a search has already dropped any point whose owner is not (owner_of)
        owner = {f: v for f, k in self.scope_fields.items() if isinstance(v := payload.get(k), str) and v.strip()}
        owner = self._with_tenant(owner)
        used = {text_key, FACT_ID_KEY, UPDATED_AT_KEY, TYPE_KEY, self.session_key, self.position_key}
        used.update(self.scope_fields.values(), self.date_keys, _LLAMA_BOOKKEEPING)
        session = payload.get(self.session_key)
        position = _position(payload.get(self.position_key))
        kind = payload.get(TYPE_KEY)
        return Fact(
            id=str(payload.get(FACT_ID_KEY) or point_id),
            text=_text_of(payload, text_key) or "",
            scope=Scope(**owner),
            type=kind if isinstance(kind, str) else None,
            date=next((d for d in (_date(payload.get(k)) for k in self.date_keys) if d is not None), None),
            updated_at=_date(payload.get(UPDATED_AT_KEY)),
            session_id=None if session is None or position is None else str(session),
            position=None if session is None else position,
            metadata={k: v for k, v in payload.items() if k not in used},
        )

    # ================================================================== writing

    @staticmethod
    def point_id(fact_id: str) -> int | str:
        """The Qdrant point id for a fact id: itself when it is an unsigned int or a UUID, else a UUID5."""
        if fact_id.isascii() and fact_id.isdigit() and int(fact_id) < 2**64:
            return int(fact_id)
        try:
            return str(uuid.UUID(fact_id))
        except ValueError:
            return str(uuid.uuid5(_ID_NAMESPACE, fact_id))

    def upsert_facts(self, facts: Sequence[Fact]) -> list[str]:
        """Embed (one call) and upsert facts as points in the layout this store reads; returns their ids.

        Upserting an id that exists replaces that point, when it is the same owner's (the same scope).
        An id whose point another owner holds (or a point whose owner fields are ambiguous) is refused
        with :class:`InvalidArgumentError`, and nothing of the batch is written: fact ids are unique per
        collection, so two tenants cannot share one. Every fact is checked before any is written (one
        ``retrieve`` of the batch's point ids). Each owner's points then go in with that owner as
        Qdrant's ``update_filter`` (its scope fields), so a write racing another user's for one id skips
        that point rather than replace it.
        """
        return self._run(self._upsert_flow(facts))

    async def aupsert_facts(self, facts: Sequence[Fact]) -> list[str]:
        """Async twin of :meth:`upsert_facts`."""
        return await self._arun(self._upsert_flow(facts))

    def _upsert_flow(self, facts: Sequence[Fact]) -> Flow[list[str]]:
        batch = self._check_facts(facts)
        layout = self._layout or (yield from self._inspect_flow())
        if not batch:
            return []
        with self._backend("retrieve (owners of the ids)"):
            held = yield _Call.of(
                "retrieve", self.collection, ids=_unique_point_ids(batch), with_payload=True, with_vectors=False
            )
        self._check_owners(batch, held)
        points = yield _Work(self._points, (batch, layout))
        with self._backend("upsert"):
            for guard, group in self._by_owner(batch, points):
                for start in range(0, len(group), _UPSERT_CHUNK):
                    chunk = group[start : start + _UPSERT_CHUNK]
                    yield _Call.of("upsert", self.collection, points=chunk, wait=True, update_filter=guard)
        self._after_write(batch, layout)
        return [f.id for f in batch]

    def _check_owners(self, batch: list[Fact], held: Sequence[Any]) -> None:
        """Refuse a fact whose id names a point of another owner (or two owners in one batch)."""
        claimed: dict[str, Fact] = {}
        for fact in batch:
            key = str(self.point_id(fact.id))
            first = claimed.setdefault(key, fact)
            if first.scope != fact.scope:
                raise InvalidArgumentError(
                    f"facts {first.id!r} and {fact.id!r} of this batch name one point but different owners; "
                    "a fact id belongs to one owner: give each owner's fact its own id"
                )
        for record in held:
            mine = claimed.get(str(record.id))
            if mine is not None and self.owner_of(record.payload or {}) != mine.scope:
                raise InvalidArgumentError(
                    f"fact id {mine.id!r} is held by another owner in collection {self.collection!r} (point "
                    f"{record.id}); pgr never replaces another owner's point: give this fact another id. "
                    "Nothing of this batch was written"
                )

    def _by_owner(
        self, batch: list[Fact], points: list[qm.PointStruct]
    ) -> list[tuple[qm.Filter | None, list[qm.PointStruct]]]:
        """The batch's points per owner, each with the filter an existing point must pass to be replaced:
        the scope fields that owner sets (a point of another user or agent is never replaced). None under
        ``single_tenant_scope``: the one owner's points need no filter."""
        groups: dict[Scope, list[qm.PointStruct]] = {}
        for fact, point in zip(batch, points, strict=True):
            groups.setdefault(fact.scope, []).append(point)
        guarded = []
        for owner, group in groups.items():
            conditions = self.scope_conditions(owner)
            guarded.append((qm.Filter(must=list(conditions)) if conditions else None, group))
        return guarded

    def _check_facts(self, facts: Sequence[Fact]) -> list[Fact]:
        batch = list(facts)
        reserved = self._reserved_keys()
        for i, fact in enumerate(batch):
            if not isinstance(fact, Fact):
                raise InvalidArgumentError(f"item {i} is a {type(fact).__name__}, not a Fact")
            if not isinstance(fact.id, str) or not fact.id:
                raise InvalidArgumentError(f"fact {i} needs a non-empty string id")
            if not isinstance(fact.text, str) or not fact.text.strip():
                raise InvalidArgumentError(f"fact {fact.id!r} has empty text")
            if (fact.session_id is None) != (fact.position is None):
                raise InvalidArgumentError(f"fact {fact.id!r}: give both session_id and position, or neither")
            self.scope_conditions(fact.scope)  # an owner this store could not filter on is refused
            clash = reserved & set(fact.metadata)
            if clash:
                raise InvalidArgumentError(
                    f"fact {fact.id!r}: metadata keys {sorted(clash)} collide with the payload keys this store "
                    "uses; rename them"
                )
        return batch

    def _reserved_keys(self) -> set[str]:
        text_key = self._layout.text_key if self._layout and self._layout.text_key else self._text_key or "text"
        return {
            text_key,
            FACT_ID_KEY,
            UPDATED_AT_KEY,
            TYPE_KEY,
            self.session_key,
            self.position_key,
            *self.scope_fields.values(),
            *self.date_keys,
            *_LLAMA_BOOKKEEPING,
        }

    def _points(self, batch: list[Fact], layout: CollectionLayout) -> list[qm.PointStruct]:
        text_key = layout.text_key or self._text_key or "text"
        if text_key == NODE_CONTENT:
            raise ConfigurationError(
                f"collection {self.collection!r} is laid out by LlamaIndex (_node_content): write to it "
                "through LlamaIndex, or give pgr a collection of its own"
            )
        vectors = self.embedder.embed([f.text for f in batch])
        points = []
        for fact, vector in zip(batch, vectors, strict=True):
            payload: dict[str, Any] = {text_key: fact.text, FACT_ID_KEY: fact.id}
            for field, value in fact.scope.as_dict().items():
                if field in self.scope_fields:  # a single tenant's field may have no key: it is implied
                    payload[self.scope_fields[field]] = value
            if fact.date is not None:
                payload[self.date_keys[0] if self.date_keys else "date"] = fact.date.isoformat()
            if fact.updated_at is not None:
                payload[UPDATED_AT_KEY] = fact.updated_at.isoformat()
            if fact.session_id is not None:
                payload[self.session_key] = fact.session_id
                payload[self.position_key] = fact.position
            if fact.type is not None:
                payload[TYPE_KEY] = fact.type
            payload.update(fact.metadata)
            values = np.asarray(vector, dtype=np.float32).tolist()
            point_vector: Any = {layout.vector_name: values} if layout.vector_name else values
            if self.sparse_vector is not None:
                point_vector = {layout.vector_name or "": values}  # "" is the unnamed dense vector
                terms = _sparse(self._bm25.embed_document(fact.text))
                if terms is not None:
                    point_vector[self.sparse_vector] = terms
            points.append(qm.PointStruct(id=self.point_id(fact.id), vector=point_vector, payload=payload))
        return points

    def _after_write(self, batch: list[Fact], layout: CollectionLayout) -> None:
        # what was just written is in the layout this store reads
        changes: dict[str, Any] = {}
        if layout.text_key is None:
            changes["text_key"] = self._text_key or "text"
        if not layout.window and self._declared_window is None and any(f.session_id for f in batch):
            changes["window"] = True
        if changes:
            self._set_layout(replace(layout, **changes))

    # ================================================================== creating a collection

    @classmethod
    def create_collection(
        cls,
        client: QdrantClient | AsyncQdrantClient,
        name: str,
        dim: int,
        *,
        embedder: Embedder,
        vector_name: str | None = None,
        distance: str = "Cosine",
        payload_indexes: bool = True,
        **store_options: Any,
    ) -> QdrantStore:
        """Create an empty collection for pgr facts and return a store over it (then :meth:`upsert_facts`).

        The collection has one dense vector (unnamed unless ``vector_name``) of ``dim`` floats and,
        on a Qdrant server, keyword indexes on the scope and session keys (local mode has no payload
        indexes). With ``sparse_vector="bm25"`` among the store options it also has that sparse vector
        (``Modifier.IDF``) and the store is hybrid. Raises :class:`ConfigurationError` when the
        collection exists: wrap it instead.

        >>> store = QdrantStore.create_collection(QdrantClient(":memory:"), "memories", 384,
        ...                                       embedder=MiniLMEmbedder())  # doctest: +SKIP
        """
        if isinstance(client, AsyncQdrantClient) and not isinstance(getattr(client, "_client", None), AsyncQdrantLocal):
            raise ConfigurationError("with a remote AsyncQdrantClient, use: await QdrantStore.acreate_collection(...)")
        spec = _NewCollection(name, dim, embedder, vector_name, distance, payload_indexes, store_options)
        return _run_blocking(cls._create_flow(client, spec), client)

    @classmethod
    async def acreate_collection(
        cls, client: QdrantClient | AsyncQdrantClient, name: str, dim: int, **options: Any
    ) -> QdrantStore:
        """Async twin of :meth:`create_collection`, with its arguments (its signature is copied below)."""
        bound = _CREATE_SIGNATURE.bind(cls, client, name, dim, **options)  # a wrong argument: TypeError
        bound.apply_defaults()
        args = bound.arguments
        spec = _NewCollection(
            name,
            dim,
            args["embedder"],
            args["vector_name"],
            args["distance"],
            args["payload_indexes"],
            args["store_options"],
        )
        return await _run_awaited(cls._create_flow(client, spec), client)

    @classmethod
    def _create_flow(cls, client: QdrantClient | AsyncQdrantClient, spec: _NewCollection) -> Flow[QdrantStore]:
        name, options = spec.name, spec.store_options
        vectors, indexes = cls._collection_spec(
            client, name, spec.dim, spec.embedder, spec.vector_name, spec.distance, options
        )
        sparse = cls._sparse_spec(options)
        with _mapped(f"creating collection {name!r}"):
            if (yield _Call.of("collection_exists", name)):
                raise ConfigurationError(
                    f"collection {name!r} exists already: wrap it with QdrantStore(client, {name!r}, embedder=...)"
                )
            yield _Call.of("create_collection", name, vectors_config=vectors, sparse_vectors_config=sparse)
            if spec.payload_indexes and not isinstance(
                getattr(client, "_client", None), QdrantLocal | AsyncQdrantLocal
            ):
                for key, schema in indexes:
                    yield _Call.of("create_payload_index", name, field_name=key, field_schema=schema)
        store = cls(client, name, embedder=spec.embedder, vector_name=spec.vector_name, **cls._store_defaults(options))
        if store._layout is None:  # a remote async client: read on this flow's calls
            yield from store._inspect_flow()
        return store

    @staticmethod
    def _store_defaults(store_options: dict[str, Any]) -> dict[str, Any]:
        return {"text_key": "text", **store_options}

    @staticmethod
    def _sparse_spec(store_options: Mapping[str, Any]) -> dict[str, qm.SparseVectorParams] | None:
        name = store_options.get("sparse_vector")
        if name is None:
            return None
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"sparse_vector must be a sparse vector name, got {name!r}")
        _bm25_model()  # refuse before creating anything when qdrant-edge-py is missing
        return {name: qm.SparseVectorParams(modifier=qm.Modifier.IDF)}

    @staticmethod
    def _collection_spec(
        client: Any,
        name: str,
        dim: int,
        embedder: Embedder,
        vector_name: str | None,
        distance: str,
        store_options: Mapping[str, Any],
    ) -> tuple[Any, list[tuple[str, qm.PayloadSchemaType]]]:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise InvalidArgumentError(f"dim must be a positive integer, got {dim!r}")
        if embedder is not None and getattr(embedder, "dim", dim) != dim:
            raise InvalidArgumentError(f"dim={dim} but the embedder gives {embedder.dim}-dim vectors")
        try:
            metric = qm.Distance(distance)
        except ValueError:
            raise InvalidArgumentError(
                f"distance must be one of {[d.value for d in qm.Distance]}, got {distance!r}"
            ) from None
        params = qm.VectorParams(size=dim, distance=metric)
        fields = _check_scope_fields(store_options.get("scope_fields"))
        indexes = [(key, qm.PayloadSchemaType.KEYWORD) for key in fields.values()]
        indexes.append((store_options.get("session_key", "session_id"), qm.PayloadSchemaType.KEYWORD))
        indexes.append((store_options.get("position_key", "position"), qm.PayloadSchemaType.INTEGER))
        return ({vector_name: params} if vector_name else params), indexes

    # ================================================================== the backend boundary

    def _run(self, flow: Flow[_T]) -> _T:
        """Drive a flow from the sync API (:func:`_run_blocking`); a remote async client is refused first."""
        if self._async and not self._local:
            flow.close()
            raise ConfigurationError(
                "this QdrantStore holds a remote AsyncQdrantClient, whose connections belong to the event "
                "loop that opened them: use the async API (PGR.aretrieve, asearch_batch, aupsert_facts), "
                "or pass a QdrantClient for sync calls"
            )
        return _run_blocking(flow, self.client)

    async def _arun(self, flow: Flow[_T]) -> _T:
        """Drive a flow from the async API (:func:`_run_awaited`)."""
        return await _run_awaited(flow, self.client)

    @contextmanager
    def _backend(self, what: str) -> Iterator[None]:
        """Inside a flow, around its ``yield`` of a client call: the client's failure as a StoreError."""
        try:
            yield
        except PGRError:
            raise
        except Exception as exc:
            raise StoreError(self._failure(what, exc)) from exc

    def _failure(self, what: str, exc: BaseException) -> str:
        text = str(exc).lower()
        if self.collection.lower() in text and ("not found" in text or "doesn't exist" in text):
            return (
                f"Qdrant collection {self.collection!r} not found ({what}: {type(exc).__name__}: {exc}); "
                "check the name, or create it with QdrantStore.create_collection(...)"
            )
        return f"Qdrant {what} on collection {self.collection!r} failed: {type(exc).__name__}: {exc}"


# ====================================================================== one flow, two drivers


@dataclass(frozen=True)
class _Call:
    """One call of the Qdrant client, by method name: ``QdrantClient`` and ``AsyncQdrantClient`` share
    their methods' names and arguments, so a flow says what to call and the driver how."""

    method: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]

    @classmethod
    def of(cls, method: str, *args: Any, **kwargs: Any) -> _Call:
        return cls(method, args, kwargs)


@dataclass(frozen=True)
class _Work:
    """Blocking work of pgr's own inside a flow (embedding): done in place with a sync client, in a
    worker thread with an async one, so it never holds up the event loop."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]


@dataclass(frozen=True)
class _NewCollection:
    """What :meth:`QdrantStore.create_collection` was asked for."""

    name: str
    dim: int
    embedder: Embedder
    vector_name: str | None
    distance: str
    payload_indexes: bool
    store_options: dict[str, Any]


def _run_blocking(flow: Flow[_T], client: QdrantClient | AsyncQdrantClient) -> _T:
    """A flow run from the sync API: blocking calls on a ``QdrantClient``; on a (local)
    ``AsyncQdrantClient``, awaited on a private event loop in a worker thread."""
    if isinstance(client, AsyncQdrantClient):
        return cast(_T, _run_in_thread(adrive(flow, partial(_aperform, client))))
    return drive(flow, partial(_perform, client))


async def _run_awaited(flow: Flow[_T], client: QdrantClient | AsyncQdrantClient) -> _T:
    """A flow run from the async API: awaited calls on an ``AsyncQdrantClient``; with a
    ``QdrantClient``, the blocking driver in a worker thread."""
    if isinstance(client, AsyncQdrantClient):
        return await adrive(flow, partial(_aperform, client))
    return await asyncio.to_thread(drive, flow, partial(_perform, client))


def _perform(client: QdrantClient, effect: _Call | _Work) -> Any:
    if isinstance(effect, _Work):
        return effect.fn(*effect.args)
    return getattr(client, effect.method)(*effect.args, **effect.kwargs)


async def _aperform(client: AsyncQdrantClient, effect: _Call | _Work) -> Any:
    if isinstance(effect, _Work):
        return await asyncio.to_thread(effect.fn, *effect.args)
    return await getattr(client, effect.method)(*effect.args, **effect.kwargs)


@contextmanager
def _mapped(what: str) -> Iterator[None]:
    try:
        yield
    except PGRError:
        raise
    except Exception as exc:
        raise StoreError(f"Qdrant {what} failed: {type(exc).__name__}: {exc}") from exc


def _bm25_model() -> Any:
    """``qdrant_edge.Bm25()``, imported on first use: only a hybrid store needs qdrant-edge-py."""
    try:
        from qdrant_edge import Bm25
    except ImportError as exc:
        raise ConfigurationError(
            f"QdrantStore(sparse_vector=...) computes BM25 with qdrant-edge-py, which is not installed: {_INSTALL_BM25}"
        ) from exc
    return Bm25()


def _sparse(vector: Any) -> qm.SparseVector | None:
    """A ``qdrant_edge`` sparse vector as qdrant-client's; None when it has no terms."""
    indices = [int(i) for i in vector.indices]
    if not indices:
        return None
    return qm.SparseVector(indices=indices, values=[float(v) for v in vector.values])


def _unique_point_ids(batch: Sequence[Fact]) -> list[int | str]:
    return list(dict.fromkeys(QdrantStore.point_id(f.id) for f in batch))


def _run_in_thread(coro: Any) -> Any:
    # a fresh loop on a worker thread works whether or not the caller's thread runs a loop
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pgr-qdrant") as pool:
        return pool.submit(asyncio.run, coro).result()


def _check_scope_fields(scope_fields: Mapping[str, str] | None) -> dict[str, str]:
    fields = dict(DEFAULT_SCOPE_FIELDS if scope_fields is None else scope_fields)
    unknown = set(fields) - set(DEFAULT_SCOPE_FIELDS)
    if unknown:
        raise ConfigurationError(
            f"scope_fields has unknown scope fields {sorted(unknown)}; use user_id, agent_id, run_id"
        )
    for field, key in fields.items():
        if not isinstance(key, str) or not key:
            raise ConfigurationError(f"scope_fields[{field!r}] must be a payload key, got {key!r}")
    return fields


def _text_of(payload: Mapping[str, Any], key: str) -> str | None:
    value = payload.get(key)
    if key == NODE_CONTENT and isinstance(value, str):
        try:
            node = json.loads(value)
        except ValueError:
            return None
        if not isinstance(node, dict):
            return None
        text = node.get("text")
        if not isinstance(text, str):  # llama-index-core >= 0.12 nests it in a text resource
            text = (node.get("text_resource") or {}).get("text")
        value = text
    return value if isinstance(value, str) and value.strip() else None


def _date(value: Any) -> Any:
    # a payload date pgr cannot read is no reason to fail a search; a naive one is UTC (module docstring)
    return read_stored_date(value)


def _position(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


# acreate_collection takes exactly create_collection's arguments: one parameter list, written once
_CREATE_SIGNATURE = inspect.signature(vars(QdrantStore)["create_collection"].__func__)
vars(QdrantStore)["acreate_collection"].__func__.__signature__ = _CREATE_SIGNATURE
