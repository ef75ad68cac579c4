"""Any LlamaIndex retriever as a pgr store: :class:`RetrieverStore`.

A LlamaIndex retriever answers one query at a time (``BaseRetriever`` has no batch API), so one pgr
round of n probes costs n ``retrieve`` calls: run in turn by :meth:`RetrieverStore.search_batch`,
concurrently (``aretrieve``, natively async) by :meth:`RetrieverStore.asearch_batch`. Still one pgr
store call per round. The two are one flow (:mod:`pgr_adapters._flows`) that yields the LlamaIndex calls
it needs by their sync name; one driver makes them, the other awaits their ``a``-named twins.

Scoping. pgr never searches unscoped, and a retriever has no notion of a user, so the store must be
told how to scope it, in one of three ways:

- a ``VectorStoreIndex`` or ``VectorIndexRetriever``: every search gets ``MetadataFilters`` with one
  ``ExactMatchFilter`` per field the caller's scope sets (``user_id``, ``agent_id``, ``run_id``
  metadata keys), ANDed with the retriever's own filters. Nodes lacking a key the scope sets never
  match, and a user-only scope sees that user's agent and run nodes too, as in mem0. The store samples
  the index's nodes at construction: when none names an owner under those keys (they keep it as
  ``owner``, or name none), it raises :class:`~pgr_core.errors.ConfigurationError` naming the metadata
  keys seen, rather than search the index empty for every user (``scope_keys={"user_id": "owner"}``, or
  one of the two ways below).
- ``scope_filter=lambda scope: retriever``: you build a retriever that only sees ``scope``'s data
  (a per-user index, a filtered retriever, a tenant-scoped client).
- ``single_tenant_scope=Scope(...)``: the explicit opt-out, meaning "this retriever holds only this
  scope's data". Searches for that exact scope run unfiltered; any other scope raises ScopeError.

Anything else raises :class:`~pgr_core.errors.ScopeError` at construction. As a belt, every returned
node whose metadata names another owner, or names its owner other than as plain strings (a list, which
many vector stores' exact-match filters match by any element; a number), is dropped (and counted in
``out_of_scope_dropped``); the search goes on with the rest.

Dates: a metadata date without a timezone is read as UTC (:func:`pgr_core._dates.read_stored_date`), so
every fact date is aware, and PGR reads a naive query date over this store as UTC too.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from llama_index.core import VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.indices.vector_store.retrievers import VectorIndexRetriever
from llama_index.core.schema import BaseNode, MetadataMode, NodeRelationship, NodeWithScore, QueryBundle
from llama_index.core.storage.docstore.types import BaseDocumentStore
from llama_index.core.vector_stores.types import ExactMatchFilter, FilterCondition, MetadataFilters

from pgr_core._dates import read_stored_date
from pgr_core.errors import ConfigurationError, InvalidArgumentError, PGRError, ScopeError, StoreError
from pgr_core.models.embedders import Embedder
from pgr_core.stores.contract import Store, validate_probes
from pgr_core.types import Capabilities, Fact, Hit, Scope, SearchParams, owner_fields

from .._flows import Flow, adrive, drive
from .._owners import owner_key_guess

__all__ = ["RetrieverStore"]

logger = logging.getLogger(__name__)

ScopeFilter = Callable[[Scope], BaseRetriever]
_SCOPE_FIELDS = ("user_id", "agent_id", "run_id")
_SAMPLE = 32  # nodes read at construction to check they name their owner (as QdrantStore samples points)


@dataclass(frozen=True)
class _Call:
    """One LlamaIndex call, by method name: the sync driver calls ``method``, the async one awaits
    ``"a" + method`` (``retrieve`` / ``aretrieve``, ``get_nodes`` / ``aget_nodes``...)."""

    target: Any
    method: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]

    @classmethod
    def of(cls, target: Any, method: str, *args: Any, **kwargs: Any) -> _Call:
        return cls(target, method, args, kwargs)


@dataclass(frozen=True)
class _EachProbe:
    """A round's retrieve flows, one per probe: driven in turn (sync) or concurrently (async)."""

    flows: list[Flow[list[NodeWithScore]]]


@dataclass(frozen=True)
class _Source:
    """Where a scope's nodes are looked up by id or listed, and who vouches for their owner.

    ``vouched``: True when every node there is the scope's (an unfiltered per-scope index), so the
    fields a node's metadata leaves out are the scope's; False when a node counts only if its own
    metadata names an owner the scope allows; None for the store's own rule (:meth:`RetrieverStore._owner`).
    """

    index: VectorStoreIndex | None
    docstore: BaseDocumentStore | None
    node_store: Any
    filters: MetadataFilters | None
    vouched: bool | None


class RetrieverStore(Store):
    """A LlamaIndex ``BaseRetriever`` (or a ``VectorStoreIndex``) seen as a pgr store.

    >>> store = RetrieverStore(index, cosine_scores=True, dates=True)          # doctest: +SKIP
    >>> store = RetrieverStore(bm25, scope_filter=lambda s: per_user[s.user_id])  # doctest: +SKIP
    >>> store = RetrieverStore(retriever, single_tenant_scope=Scope(user_id="u1"))  # doctest: +SKIP

    Θ: each probe asks for ``top_k`` nodes where the retriever lets pgr set it (a
    ``VectorIndexRetriever``, also one returned by ``scope_filter``: a copy with ``similarity_top_k``
    = K); any other retriever decides how many it returns, so give it at least the K pgr uses (20 for
    the query). pgr then ranks by score, cuts to K and drops scores below τ (``min_score``); a node
    without a score counts as 0.0, so run PGR with ``min_score=0.0`` over unscored retrievers.

    Nodes become facts: id = ``node_id``, text = the node's content without metadata, date from the
    ``date`` or ``created_at`` metadata (ISO string, date, datetime or a Unix timestamp), type from
    ``type``, session and position from ``session_id``/``position``, scope from the scope metadata
    keys, and the node's metadata as ``Fact.metadata``.

    Temporal window (``SearchParams.window`` = w): a hit's neighbours are the nodes its
    ``PREVIOUS``/``NEXT`` relationships chain to (the consecutive chunks or turns of one document),
    fetched by id from the docstore: the index's for a ``VectorStoreIndex`` or ``VectorIndexRetriever``,
    or the one passed as ``docstore=``; for a vector store that keeps the nodes itself (``stores_text``),
    from its ``get_nodes``. Each comes right after its anchor as ``Hit(neighbour_of=anchor id)``,
    ordered -1, +1, -2, +2... The ``window`` capability is declared only when such a lookup exists.
    The same look-up serves facts by id (:meth:`get_many`, :meth:`get`) and the window of given hits
    (:meth:`with_window`), which :class:`pgr_core.Anticipating` asks for the facts its cues found,
    and the listing of every fact of a scope (:meth:`facts_for`) that ``Anticipating.build`` backfills.
    Under ``scope_filter`` the retriever it builds for the scope says where: a ``VectorIndexRetriever``'s
    index (a per-scope index is that scope's own; its nodes are the scope's when it is unfiltered),
    else the store's own look-up; a node found there that no unfiltered per-scope index vouches for
    counts only when its metadata names an owner the scope allows (a look-up by id bypasses filters).
    The ``by_id`` and ``lists`` capabilities are declared where such a look-up exists or may
    (``scope_filter``: the retriever built for a scope brings one or not).

    Declare what you know about your data: ``cosine_scores=True`` when scores are cosine similarities
    (so τ means what it says), ``dates=True`` when every node carries a date.

    Options:

    - ``scope_keys``: metadata key per scope field, default ``{"user_id": "user_id", ...}``. Scoped by
      metadata filters, the store reads up to 32 of the index's nodes from its docstore at construction
      and refuses (:class:`ConfigurationError`, naming the keys seen) an index none of whose sampled
      nodes carries one of these keys; when only some do, the others are nobody's and a warning says how
      many. An empty index, or one whose vector store keeps the nodes (nothing cheap to sample), is
      not checked.
    - ``retriever_kwargs``: passed to ``index.as_retriever`` when a ``VectorStoreIndex`` is given.
    - ``embedder``: a pgr embedder for probe hygiene (duplicate and echo detection); without one,
      pgr compares probes by their words.
    - ``max_concurrency``: most ``aretrieve`` calls in flight at once in :meth:`asearch_batch`.
    - ``batch_embed``: embed a round's probes in one ``get_text_embedding_batch`` call of the
      ``VectorIndexRetriever``'s embed model and hand each ``retrieve`` its vector
      (``QueryBundle.embedding``): one embedding call per round instead of one per probe. Only for
      symmetric embedding models (MiniLM, OpenAI's text-embedding-3); leave it off for a model that
      embeds queries differently from documents (an instruction prefix). Retrievers other than a
      ``VectorIndexRetriever`` embed per probe as usual.
    """

    #: Metadata dates without a timezone are read as UTC; PGR reads a naive query date so too.
    naive_dates_are_utc: ClassVar[bool] = True

    def __init__(
        self,
        retriever: BaseRetriever | VectorStoreIndex,
        *,
        scope_filter: ScopeFilter | None = None,
        single_tenant_scope: Scope | Mapping[str, str] | None = None,
        docstore: BaseDocumentStore | None = None,
        scope_keys: Mapping[str, str] | None = None,
        retriever_kwargs: Mapping[str, Any] | None = None,
        cosine_scores: bool = False,
        dates: bool = False,
        embedder: Embedder | None = None,
        max_concurrency: int = 8,
        batch_embed: bool = False,
    ) -> None:
        if not isinstance(retriever, BaseRetriever | VectorStoreIndex):
            raise InvalidArgumentError(
                f"retriever must be a LlamaIndex BaseRetriever or VectorStoreIndex, not {type(retriever).__name__}"
            )
        if scope_filter is not None and single_tenant_scope is not None:
            raise InvalidArgumentError("pass scope_filter or single_tenant_scope, not both")
        if scope_filter is not None and not callable(scope_filter):
            raise InvalidArgumentError("scope_filter must be a callable (Scope) -> BaseRetriever")
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise InvalidArgumentError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}")
        keys = {f: f for f in _SCOPE_FIELDS} | dict(scope_keys or {})
        unknown = set(keys) - set(_SCOPE_FIELDS)
        if unknown:
            raise InvalidArgumentError(f"scope_keys has unknown field(s) {sorted(unknown)}; use {_SCOPE_FIELDS}")
        if retriever_kwargs and not isinstance(retriever, VectorStoreIndex):
            raise InvalidArgumentError("retriever_kwargs apply only when a VectorStoreIndex is given")

        self.retriever = retriever
        self.scope_keys: dict[str, str] = keys
        self.retriever_kwargs = dict(retriever_kwargs or {})
        self.embedder = embedder
        self.max_concurrency = max_concurrency
        self.batch_embed = batch_embed
        self._scope_filter = scope_filter
        self._tenant = Scope.coerce(single_tenant_scope) if single_tenant_scope is not None else None
        if scope_filter is not None:
            self.scoping = "scope_filter"
        elif self._tenant is not None:
            self.scoping = "single_tenant"
        elif isinstance(retriever, VectorStoreIndex | VectorIndexRetriever):
            self.scoping = "metadata_filters"
        else:
            raise ScopeError(
                f"cannot scope a {type(retriever).__name__}: pgr never searches unscoped. Pass "
                "scope_filter=lambda scope: <a retriever over that scope's data only>, give a VectorStoreIndex "
                "or VectorIndexRetriever (scoped by metadata filters), or, if this retriever holds one "
                "tenant's data only, single_tenant_scope=Scope(user_id=...)"
            )

        index = retriever if isinstance(retriever, VectorStoreIndex) else getattr(retriever, "_index", None)
        if docstore is None and isinstance(retriever, VectorStoreIndex | VectorIndexRetriever):
            docstore = retriever.docstore if isinstance(retriever, VectorStoreIndex) else retriever._docstore
        self.docstore = docstore
        self._index = index if isinstance(index, VectorStoreIndex) else None
        vector_store = getattr(index, "vector_store", None) if isinstance(index, VectorStoreIndex) else None
        self._node_store = vector_store if getattr(vector_store, "stores_text", False) else None
        # instance-level: what a retriever can do depends on the retriever and on what the user declares
        lookup = self.docstore is not None or self._node_store is not None
        # facts by id and a scope's listing need a node look-up: the store's own, or under scope_filter
        # the one of the retriever it builds for each scope (get_many and facts_for say when there is none)
        reads = lookup or self.scoping == "scope_filter"
        self.capabilities = Capabilities(  # type: ignore[misc]
            dates=dates,
            cosine_scores=cosine_scores,
            window=lookup,
            native_async=True,
            lists=reads,  # facts_for
            by_id=reads,  # get, get_many
        )
        self._lock = threading.Lock()
        self.retriever_calls = 0  # retrieve / aretrieve calls made, one per probe
        self.neighbour_lookups = 0  # docstore look-ups made for the window, one per level of it
        self.id_lookups = 0  # docstore look-ups made by get_many, one per call
        self.out_of_scope_dropped = 0  # nodes the belt refused (their metadata names another owner)
        self.embed_batches = 0  # batch_embed: get_text_embedding_batch calls made, one per round
        if self.scoping == "metadata_filters":
            self._check_owner_keys()

    def __repr__(self) -> str:
        return f"RetrieverStore({type(self.retriever).__name__}, scoping={self.scoping!r})"

    # ------------------------------------------------------------------ the store hook

    def search_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        """One ``retrieve`` call per probe, in turn; window neighbours from one docstore look-up per level."""
        return drive(self._search_flow(probes, scope, params), self._perform)

    async def asearch_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        """The probes of a round run concurrently (``aretrieve``), at most ``max_concurrency`` at once."""
        return await adrive(self._search_flow(probes, scope, params), self._aperform)

    def _search_flow(self, probes: Sequence[str], scope: Scope, params: SearchParams) -> Flow[list[list[Hit]]]:
        """One round, written once for both APIs (:mod:`pgr_adapters._flows`): the probes' embeddings
        (``batch_embed``), one retrieve per probe, then the window's look-ups."""
        probes = validate_probes(probes)
        scope = Scope.coerce(scope)
        if not probes:
            return []
        retriever = self._scoped_retriever(scope, params.top_k)
        embed_model = self._batch_embed_model(retriever)
        vectors: list[Any] = [None] * len(probes)
        if embed_model is not None:
            self._count(embed_batches=1)
            try:
                vectors = yield _Call.of(embed_model, "get_text_embedding_batch", probes)
            except Exception as exc:
                raise StoreError(f"embedding the round's probes failed: {exc}") from exc
        bundles = [QueryBundle(query_str=p, embedding=v) for p, v in zip(probes, vectors, strict=True)]
        node_lists = yield _EachProbe([self._retrieve_flow(retriever, i, b) for i, b in enumerate(bundles)])
        hit_lists = [self._direct_hits(nodes, scope, params) for nodes in node_lists]
        if params.window and self.capabilities.window:
            source = self._source(scope, retriever)
            neighbours = yield from _walk_neighbours(_anchors(hit_lists), params.window, self._fetcher(source))
            hit_lists = [self._with_neighbours(hits, neighbours, scope, source.vouched) for hits in hit_lists]
        return [[hit for hit, _ in hits] for hits in hit_lists]

    def _retrieve_flow(self, retriever: BaseRetriever, i: int, bundle: QueryBundle) -> Flow[list[NodeWithScore]]:
        self._count(retriever_calls=1)
        try:
            return (yield _Call.of(retriever, "retrieve", bundle))
        except Exception as exc:
            raise StoreError(f"{type(retriever).__name__} failed to retrieve for probe {i}: {exc}") from exc

    # -- the two drivers' ways of performing a flow's effects

    def _perform(self, effect: _Call | _EachProbe) -> Any:
        """One effect with blocking calls; a round's probes in turn."""
        if isinstance(effect, _EachProbe):
            return [drive(flow, self._perform) for flow in effect.flows]
        return getattr(effect.target, effect.method)(*effect.args, **effect.kwargs)

    async def _aperform(self, effect: _Call | _EachProbe) -> Any:
        """One effect awaited (LlamaIndex names every async twin ``a`` + the sync name); a round's probes
        concurrently, at most ``max_concurrency`` at once."""
        if isinstance(effect, _EachProbe):
            gate = asyncio.Semaphore(self.max_concurrency)

            async def one(flow: Flow[Any]) -> Any:
                async with gate:
                    return await adrive(flow, self._aperform)

            return await asyncio.gather(*(one(flow) for flow in effect.flows))
        return await getattr(effect.target, "a" + effect.method)(*effect.args, **effect.kwargs)

    # ------------------------------------------------------------------ scoping

    def _scoped_retriever(self, scope: Scope, top_k: int) -> BaseRetriever:
        """A retriever that sees only ``scope``'s data, asking for ``top_k`` nodes where it can."""
        if self.scoping == "scope_filter":
            assert self._scope_filter is not None
            try:
                built = self._scope_filter(scope)
            except PGRError:
                raise
            except Exception as exc:
                raise StoreError(f"scope_filter failed for scope {scope.as_dict()}: {exc}") from exc
            if not isinstance(built, BaseRetriever):
                raise ConfigurationError(
                    f"scope_filter must return a LlamaIndex BaseRetriever, got {type(built).__name__}"
                )
            return _with_top_k(built, top_k)
        if self.scoping == "single_tenant":
            self._check_tenant(scope)
            if isinstance(self.retriever, VectorStoreIndex):
                return self.retriever.as_retriever(similarity_top_k=top_k, **self.retriever_kwargs)
            return _with_top_k(self.retriever, top_k)
        filters = self._scope_filters(scope)
        if isinstance(self.retriever, VectorStoreIndex):
            return self.retriever.as_retriever(similarity_top_k=top_k, filters=filters, **self.retriever_kwargs)
        assert isinstance(self.retriever, VectorIndexRetriever)
        scoped = copy.copy(self.retriever)  # a copy per call: concurrent scopes never share filters
        scoped._similarity_top_k = top_k
        scoped._filters = _and(self.retriever._filters, filters)
        return scoped

    def _check_owner_keys(self) -> None:
        """Refuse an index none of whose sampled nodes names an owner under ``scope_keys``: filtered by
        them, every search would come back empty, for every user. Nodes without one are nobody's."""
        nodes = self._sample_nodes()
        if not nodes:
            return
        keys = list(dict.fromkeys(self.scope_keys.values()))
        unowned = sum(1 for n in nodes if all((n.metadata or {}).get(k) is None for k in keys))
        seen = sorted({k for n in nodes for k in (n.metadata or {})})
        if unowned == len(nodes):
            raise ConfigurationError(
                f"none of the {len(nodes)} sampled nodes of this index names an owner under the metadata keys "
                f"pgr filters on {keys}, so every search would come back empty; their metadata keys are {seen}. "
                f'Map the key that holds the owner, e.g. scope_keys={{"user_id": "{owner_key_guess(seen)}"}}, '
                "or, if the index holds one tenant's data only, pass single_tenant_scope=Scope(user_id=...) "
                "(or scope_filter=lambda scope: <a retriever over that scope's data only>)"
            )
        if unowned:
            logger.warning(
                "%d of %d sampled nodes carry none of the owner metadata keys %s: no scope sees them",
                unowned,
                len(nodes),
                keys,
            )

    def _sample_nodes(self) -> list[BaseNode]:
        """Up to :data:`_SAMPLE` of the index's nodes, read from its docstore by id."""
        if self._index is None or self.docstore is None:
            return []
        try:
            ids = list(dict.fromkeys(self._index.index_struct.nodes_dict.values()))[:_SAMPLE]
            return [n for n in self.docstore.get_nodes(ids, raise_error=False) if n] if ids else []
        except Exception as exc:
            raise StoreError(f"reading a sample of the index's nodes failed: {exc}") from exc

    def _check_tenant(self, scope: Scope) -> None:
        """A single-tenant store answers for its one scope only (ScopeError for any other)."""
        if self.scoping == "single_tenant" and scope != self._tenant:
            assert self._tenant is not None
            raise ScopeError(
                f"this RetrieverStore holds only the data of {self._tenant.as_dict()} (single_tenant_scope); "
                f"it cannot answer for {scope.as_dict()}. Give it a scope_filter to serve other scopes"
            )

    def _source(self, scope: Scope, retriever: BaseRetriever | None = None) -> _Source:
        """Where ``scope``'s nodes are looked up and listed, and who vouches for their owner: the one
        rule :meth:`facts_for`, :meth:`get_many` and the window (of a search or :meth:`with_window`) share.

        Without ``scope_filter``: the store's own look-up under its own owner rule. Under it: the
        retriever it builds for ``scope`` (``retriever``, when a search built it already). A
        ``VectorIndexRetriever``'s index is where that scope's nodes are, and vouches for their owner
        when the retriever is unfiltered (a per-scope index); a filtered one does not (a look-up by id
        bypasses its filters). Any other retriever has no look-up the store knows of: the store's own is
        used, and vouches for no one.
        """
        if self.scoping != "scope_filter":
            filters = self._scope_filters(scope) if self.scoping == "metadata_filters" else None
            return _Source(self._index, self.docstore, self._node_store, filters, None)
        built = retriever if retriever is not None else self._scoped_retriever(scope, 1)
        if not isinstance(built, VectorIndexRetriever):
            return _Source(self._index, self.docstore, self._node_store, None, False)
        index, filters = built._index, built._filters
        vector_store = getattr(index, "vector_store", None)
        node_store = vector_store if getattr(vector_store, "stores_text", False) else None
        return _Source(index, built._docstore, node_store, filters, filters is None or not filters.filters)

    def _batch_embed_model(self, retriever: BaseRetriever) -> BaseEmbedding | None:
        """The embed model to batch a round's probes with, when ``batch_embed`` applies to ``retriever``."""
        if not self.batch_embed or not isinstance(retriever, VectorIndexRetriever) or not retriever._needs_embedding():
            return None
        return retriever._embed_model

    def _scope_filters(self, scope: Scope) -> MetadataFilters:
        """One exact match per field the scope sets; unset fields do not constrain (mem0's model)."""
        return MetadataFilters(
            filters=[ExactMatchFilter(key=self.scope_keys[f], value=v) for f, v in scope.as_dict().items()],
            condition=FilterCondition.AND,
        )

    def _owner(self, node: BaseNode, scope: Scope, *, vouched: bool | None = None) -> Scope | None:
        """The scope a node belongs to, from its metadata; None when ``scope`` may not see it.

        Under ``scope_filter`` or ``single_tenant_scope`` the scoping vouches for the fields a node's
        metadata leaves out; under metadata filters a missing key means the backend ignored the filter.
        ``vouched`` overrides that for nodes no scoped retriever chose (listed by :meth:`facts_for`,
        looked up by id for :meth:`get_many` and the window): see :meth:`_source`.
        """
        owner = owner_fields(node.metadata or {}, self.scope_keys)
        if owner is None:
            return None  # a list or a number names no one plainly: the node is nobody's
        fill_in = self.scoping != "metadata_filters" if vouched is None else vouched
        if fill_in:
            for field, value in scope.as_dict().items():
                owner.setdefault(field, value)
        if not owner:
            return None
        try:
            found = Scope(**owner)
        except ScopeError:
            return None
        return found if scope.allows(found) else None

    # ------------------------------------------------------------------ nodes to hits

    def _direct_hits(
        self, nodes: Sequence[NodeWithScore], scope: Scope, params: SearchParams
    ) -> list[tuple[Hit, BaseNode]]:
        """Belt (scope), rank by score, cut to K, drop scores below τ."""
        kept = []
        for scored in nodes:
            owner = self._owner(scored.node, scope)
            if owner is None:
                self._count(out_of_scope_dropped=1)
                logger.warning(
                    "dropped node %s: its metadata does not match scope %s", scored.node.node_id, scope.as_dict()
                )
                continue
            kept.append((float(scored.score) if scored.score is not None else 0.0, scored.node, owner))
        kept.sort(key=lambda item: -item[0])  # stable: ties keep the retriever's order
        hits = []
        for rank, (score, node, owner) in enumerate(kept[: params.top_k]):
            if score < params.min_score:
                break
            hits.append((Hit(fact=self.fact(node, owner), score=score, rank=rank), node))
        return hits

    def _with_neighbours(
        self,
        hits: list[tuple[Hit, BaseNode]],
        neighbours: Mapping[str, list[BaseNode]],
        scope: Scope,
        vouched: bool | None,
    ) -> list[tuple[Hit, BaseNode]]:
        out = []
        for hit, node in hits:
            out.append((hit, node))
            for other in neighbours.get(node.node_id, []):
                owner = self._owner(other, scope, vouched=vouched)
                if owner is None:
                    self._count(out_of_scope_dropped=1)
                    continue
                neighbour = Hit(fact=self.fact(other, owner), score=0.0, rank=hit.rank, neighbour_of=hit.fact.id)
                out.append((neighbour, other))
        return out

    def fact(self, node: BaseNode, owner: Scope) -> Fact:
        """The pgr fact a node stands for (see the class docstring for where each field comes from)."""
        metadata = dict(node.metadata or {})
        session, position = metadata.get("session_id"), metadata.get("position")
        has_turn = session not in (None, "") and isinstance(position, int) and not isinstance(position, bool)
        kind = metadata.get("type")
        return Fact(
            id=node.node_id,
            text=node.get_content(metadata_mode=MetadataMode.NONE),
            scope=owner,
            type=str(kind) if kind not in (None, "") else None,
            date=_date(metadata.get("date", metadata.get("created_at"))),
            updated_at=_date(metadata.get("updated_at")),
            session_id=str(session) if has_turn else None,
            position=position if has_turn else None,
            metadata=metadata,
        )

    # ------------------------------------------------------------------ facts by id, the window of given hits

    def get_many(self, fact_ids: Sequence[str], *, scope: Scope | Mapping[str, str]) -> dict[str, Fact]:
        """fact id (node id) -> fact for those of ``fact_ids`` whose node ``scope`` may see (the owner
        check a search makes), built as search hits are; unknown ids are left out. What
        :class:`pgr_core.Anticipating` asks for the facts it found through their cues.

        One look-up by id, the one the window uses: the docstore's ``get_nodes`` (and the vector
        store's, for ids the docstore lacks); under ``scope_filter``, those of the index the retriever
        it builds for ``scope`` searches, with the owner rule :meth:`facts_for` applies. Counted in
        ``id_lookups``. A store with neither (a retriever given without ``docstore=``) raises
        :class:`ConfigurationError`.
        """
        scope = Scope.coerce(scope)
        self._check_tenant(scope)
        source = self._source(scope)
        self._check_lookup("fetch facts by id", source)
        ids = list(dict.fromkeys(str(i) for i in fact_ids))
        if not ids:
            return {}
        nodes = drive(self._fetch_flow(ids, source, counter="id_lookups"), self._perform)
        out: dict[str, Fact] = {}
        for fact_id in ids:
            node = nodes.get(fact_id)
            owner = self._owner(node, scope, vouched=source.vouched) if node is not None else None
            if node is not None and owner is not None:
                out[fact_id] = self.fact(node, owner)
        return out

    def get(self, fact_id: str, *, scope: Scope | Mapping[str, str]) -> Fact | None:
        """The node ``fact_id`` as a fact if ``scope`` may see it, else None: :meth:`get_many` of that one id."""
        return self.get_many([fact_id], scope=scope).get(str(fact_id))

    def with_window(
        self, hits: Sequence[Hit], *, scope: Scope | Mapping[str, str], window: int
    ) -> dict[str, list[Hit]]:
        """The ±window neighbours of each hit's node along its PREVIOUS/NEXT chain, as a search's window
        brings them: fact id -> neighbour hits (ordered -1, +1, -2, +2...). One look-up for the anchors'
        nodes (a Fact does not carry the relationships), then one per level of the window; where and
        under which owner rule as :meth:`get_many`."""
        scope = Scope.coerce(scope)
        self._check_tenant(scope)
        if window < 1 or not self.capabilities.window:
            return {}
        anchors = {h.fact.id: h for h in hits if h.neighbour_of is None}
        if not anchors:
            return {}
        source = self._source(scope)
        vouched = source.vouched
        nodes = drive(self._fetch_flow(list(anchors), source), self._perform)
        pairs = [
            (hit, nodes[i])
            for i, hit in anchors.items()
            if i in nodes and self._owner(nodes[i], scope, vouched=vouched) is not None
        ]
        walk = _walk_neighbours([node for _, node in pairs], window, self._fetcher(source))
        neighbours = drive(walk, self._perform)
        out: dict[str, list[Hit]] = {}
        for hit, node in pairs:
            found = [h for h, _ in self._with_neighbours([(hit, node)], neighbours, scope, vouched)[1:]]
            if found:
                out[hit.fact.id] = found
        return out

    def facts_for(self, scope: Scope | Mapping[str, str]) -> list[Fact]:
        """Every node ``scope`` may see, as a fact built as search hits are (:meth:`fact`): what
        :meth:`pgr_core.Anticipating.build` backfills cues for. Reads only; nothing is written.

        The nodes are the index's (its ``index_struct`` node ids, from its docstore; every node of a
        docstore given as ``docstore=``) and, for a vector store that keeps the nodes itself
        (``stores_text``), its ``get_nodes`` (under the scope's metadata filters when the store is scoped
        by them). Each passes the owner check a search makes. Under ``scope_filter``, the retriever it
        builds for ``scope`` says where the scope's nodes are: an unfiltered ``VectorIndexRetriever``'s
        index is that scope's (its nodes are the scope's, as its search hits are); otherwise the store's
        own nodes are listed and a node counts only when its metadata names an owner ``scope`` allows.
        A store with neither look-up raises the :class:`ConfigurationError` :meth:`get_many` raises.
        """
        scope = Scope.coerce(scope)
        self._check_tenant(scope)
        source = self._source(scope)
        self._check_lookup("list its facts", source)
        found: dict[str, Fact] = {}
        for node in self._list_nodes(source):
            owner = self._owner(node, scope, vouched=source.vouched)
            if owner is not None:
                fact = self.fact(node, owner)
                if fact.text.strip():
                    found.setdefault(fact.id, fact)
        return list(found.values())

    def _list_nodes(self, source: _Source) -> list[BaseNode]:
        """The nodes of an index (or of a docstore given alone), then those its vector store keeps."""
        index, docstore, node_store, filters = source.index, source.docstore, source.node_store, source.filters
        nodes: dict[str, BaseNode] = {}
        try:
            if docstore is not None:
                if index is not None:
                    ids = list(dict.fromkeys(index.index_struct.nodes_dict.values()))
                    listed = docstore.get_nodes(ids, raise_error=False) if ids else []
                else:
                    listed = list(docstore.docs.values())
                nodes.update((n.node_id, n) for n in listed if n)
            if node_store is not None:
                try:
                    nodes.update(
                        (n.node_id, n) for n in node_store.get_nodes(filters=filters) if n.node_id not in nodes
                    )
                except NotImplementedError:
                    if docstore is None:
                        raise ConfigurationError(
                            f"this RetrieverStore cannot list its facts: {type(node_store).__name__} cannot list "
                            "its nodes (get_nodes) and there is no docstore; pass docstore=<the docstore holding "
                            "the nodes>"
                        ) from None
        except PGRError:
            raise
        except Exception as exc:
            raise StoreError(f"listing the nodes failed: {exc}") from exc
        return list(nodes.values())

    def _check_lookup(self, what: str, source: _Source) -> None:
        if source.docstore is None and source.node_store is None:
            raise ConfigurationError(
                f"this RetrieverStore cannot {what}: it has no docstore and its vector store keeps no nodes; "
                "pass docstore=<the docstore holding the nodes> (a VectorStoreIndex or VectorIndexRetriever "
                "brings its own)"
            )

    # ------------------------------------------------------------------ look-ups by node id

    def _fetch_flow(
        self, node_ids: list[str], source: _Source, counter: str = "neighbour_lookups"
    ) -> Flow[dict[str, BaseNode]]:
        """The nodes of ``node_ids`` that ``source`` holds (its docstore, then its vector store)."""
        self._count(**{counter: 1})
        found: dict[str, BaseNode] = {}
        try:
            if source.docstore is not None:
                nodes = yield _Call.of(source.docstore, "get_nodes", node_ids, raise_error=False)
                found.update((n.node_id, n) for n in nodes if n)
            missing = [i for i in node_ids if i not in found]
            if missing and source.node_store is not None:
                found.update((n.node_id, n) for n in (yield _Call.of(source.node_store, "get_nodes", node_ids=missing)))
        except NotImplementedError:
            pass  # a vector store that cannot fetch by id: no neighbours beyond the docstore's
        except Exception as exc:
            raise StoreError(f"fetching window neighbours failed: {exc}") from exc
        return found

    def _fetcher(self, source: _Source) -> Callable[[list[str]], Flow[dict[str, BaseNode]]]:
        """The window's look-up in ``source``, for :func:`_walk_neighbours`."""
        return lambda node_ids: self._fetch_flow(node_ids, source)

    def _count(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)


# ---------------------------------------------------------------------- helpers


def _with_top_k(retriever: BaseRetriever, top_k: int) -> BaseRetriever:
    """A copy asking for ``top_k`` nodes when the retriever has that knob; otherwise the retriever itself."""
    if isinstance(retriever, VectorIndexRetriever):
        sized = copy.copy(retriever)
        sized._similarity_top_k = top_k
        return sized
    return retriever


def _and(existing: MetadataFilters | None, scope: MetadataFilters) -> MetadataFilters:
    """The retriever's own filters AND the scope's (nested only when its own are OR/NOT)."""
    if existing is None or not existing.filters:
        return scope
    if existing.condition in (None, FilterCondition.AND):
        return MetadataFilters(filters=[*existing.filters, *scope.filters], condition=FilterCondition.AND)
    return MetadataFilters(filters=[existing, *scope.filters], condition=FilterCondition.AND)


def _date(value: Any) -> datetime | None:
    """A metadata date, leniently: one unreadable date must not fail every search that meets it; a naive
    one is UTC (the module docstring)."""
    return read_stored_date(value)


def _anchors(hit_lists: Sequence[Sequence[tuple[Hit, BaseNode]]]) -> list[BaseNode]:
    return list({node.node_id: node for hits in hit_lists for _, node in hits}.values())


def _related_id(node: BaseNode, direction: int) -> str | None:
    relation = node.relationships.get(NodeRelationship.PREVIOUS if direction < 0 else NodeRelationship.NEXT)
    return getattr(relation, "node_id", None)  # a list of relations is no chain: ignored


def _walk_neighbours(
    anchors: Sequence[BaseNode], window: int, fetch: Callable[[list[str]], Flow[dict[str, BaseNode]]]
) -> Flow[dict[str, list[BaseNode]]]:
    """Follow PREVIOUS/NEXT up to ``window`` steps from every anchor, one look-up per step.

    A flow: each step's look-up is ``fetch(node ids)``, a flow giving ``{id: node}``; it returns each
    anchor's neighbours ordered -1, +1, -2, +2... (the order of the embedded store's window)."""
    cache: dict[str, BaseNode] = {a.node_id: a for a in anchors}
    tips: dict[tuple[str, int], BaseNode] = {(a.node_id, d): a for a in anchors for d in (-1, 1)}
    at: dict[str, dict[int, BaseNode]] = {a.node_id: {} for a in anchors}
    for step in range(1, window + 1):
        wanted = {key: rid for key, node in tips.items() if (rid := _related_id(node, key[1])) is not None}
        missing = sorted({rid for rid in wanted.values() if rid not in cache})
        if missing:
            cache.update((yield from fetch(missing)))
        tips = {}
        for (anchor, direction), rid in wanted.items():
            if rid in cache:
                at[anchor][direction * step] = cache[rid]
                tips[(anchor, direction)] = cache[rid]
        if not tips:
            break
    order = [d * s for s in range(1, window + 1) for d in (-1, 1)]
    return {anchor: [found[o] for o in order if o in found] for anchor, found in at.items()}
