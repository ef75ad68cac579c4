"""A mem0 ``Memory`` (or ``AsyncMemory``) as a pgr store, and a drop-in ``search`` that runs PGR on it.

How a round of probes reaches mem0 (``Mem0Store.search_path``):

- ``"batch"`` (mem0ai 2.x): one ``embedding_model.embed_batch`` for every probe of the round, then one
  ``vector_store.search_batch`` with the caller's scope in ``filters``. Scores are the vector store's
  own similarities (cosine for Qdrant, mem0's default), and τ is applied to them.
- ``"search"`` (mem0ai 1.0.x, graph memory, or on request): ``memory.search`` once per probe, the scope
  passed the way the installed mem0 wants it (2.x: inside ``filters``, ``top_k=``; 1.0.x: top-level
  ``user_id=...``, ``limit=``). mem0 applies τ as its ``threshold`` (on the semantic score). Graph
  relations come back in the same call.

Graph relations (mem0ai 1.0.x with a ``graph_store``) become facts of type ``"relation"`` whose text is
"source relationship destination". They compete with vector hits for the same K: each is scored by the
cosine between the probe and that sentence, embedded with mem0's own embedder (one batch per round for
the probes and the relations together), must clear τ, and takes its place in the ranking by that score.

mem0 keeps no turn order, so there is no temporal window (``capabilities.window`` is False).
Facts by id (:meth:`Mem0Store.get_many`) are one ``memory.get`` each: mem0 has no batch get. Every
fact of a scope (:meth:`Mem0Store.facts_for`, what ``Anticipating.build`` backfills cues for) is
``memory.get_all`` under that scope.

Owners and dates (see :mod:`._records`): a record whose owner ids are not plain strings is dropped from
a search and counted in ``Mem0Store.out_of_scope_dropped`` (the search goes on with the rest), and a
``created_at`` without a timezone is read as UTC, as is a naive query date given to PGR over this store.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import inspect
import logging
import threading
import warnings
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pgr_core.errors import ConfigurationError, InvalidArgumentError, ScopeError, StoreError
from pgr_core.models.embedders import unit_rows
from pgr_core.models.llm import LLM
from pgr_core.observability.trace import FoundFact, RetrievalResult
from pgr_core.policy.pgr import PGR, PGRConfig
from pgr_core.stores.contract import Store, validate_probes
from pgr_core.types import Capabilities, Fact, Hit, Scope, SearchParams

from ._records import (
    SCOPE_KEYS,
    Mem0Fact,
    expired,
    fact_from_item,
    fact_from_point,
    relation_fact,
    visible_to,
    write_metadata,
)

__all__ = ["Mem0Fact", "Mem0Store"]

logger = logging.getLogger(__name__)

SearchPath = Literal["auto", "batch", "search"]
# Vector stores whose search score is a cosine similarity as mem0 configures them (Qdrant collections
# are created with COSINE distance). Other providers may return distances; τ would not mean cosine.
_COSINE_PROVIDERS = frozenset({"qdrant"})
_PGR_ARGUMENTS = frozenset({"strategy", "config", "embedder"}) | frozenset(PGRConfig.__dataclass_fields__)
_RELATION_ID = "rel-"  # the id prefix of a graph relation's fact (._records.relation_fact)
_LIST_PAGE = 1000  # memories asked of get_all at first by facts_for (doubled while a page comes back full)
# mem0's graph store keys every node by user_id; mem0's add() writes "user" when none is given.
_GRAPH_NEEDS_USER = "mem0 graph memory (1.0.x) keys every relation by user_id: add user_id to the scope"


class Mem0Store(Store):
    """A mem0 ``Memory`` / ``AsyncMemory`` that you built, seen by pgr through one search per round.

    >>> store = Mem0Store(Memory.from_config(config))                         # doctest: +SKIP
    >>> store.search("Should I join a soccer league?", filters={"user_id": "u1"})  # doctest: +SKIP
    {'results': [{'id': ..., 'memory': ..., 'score': ..., 'created_at': ...}, ...]}

    - ``llm``: the LLM PGR prospects with. Without one, PGR's default is no prospection (the drop-in
      :meth:`search` then gives the query's own list); pass ``strategy="feedback"`` for one LLM-free
      round (the request joined to its first hits searches again: two mem0 searches).
    - ``search_path``: ``"auto"`` picks ``"batch"`` when mem0 exposes ``vector_store.search_batch`` and
      the memory has no graph store, ``"search"`` otherwise (see the module docstring).
    - ``pgr_options``: ``strategy=``, ``config=``, ``embedder=`` or any :class:`~pgr_core.PGRConfig`
      field, for the PGR that :meth:`search` runs (built on first use).

    Facts come back as :class:`Mem0Fact`: id = mem0's memory id, text = ``memory``, date =
    ``created_at``, ``updated_at``, type and metadata from mem0's ``metadata``, and the mem0 record itself.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(
        writable=True, dates=True, cosine_scores=True, window=False, lists=True, by_id=True
    )
    #: mem0 dates without a timezone are read as UTC; PGR reads a naive query date so too.
    naive_dates_are_utc: ClassVar[bool] = True

    def __init__(
        self, memory: Any, llm: LLM | None = None, *, search_path: SearchPath = "auto", **pgr_options: Any
    ) -> None:
        if not callable(getattr(memory, "search", None)) or not callable(getattr(memory, "add", None)):
            raise InvalidArgumentError(
                f"Mem0Store wraps a mem0 Memory or AsyncMemory, not {type(memory).__name__}: "
                "build one with Memory.from_config({...})"
            )
        unknown = set(pgr_options) - _PGR_ARGUMENTS
        if unknown:
            raise InvalidArgumentError(f"unknown PGR option(s) {sorted(unknown)}; options are {sorted(_PGR_ARGUMENTS)}")
        self.memory = memory
        self.llm = llm
        self._pgr_options = dict(pgr_options)
        self._pgr: PGR | None = None
        self.is_async = inspect.iscoroutinefunction(memory.search)
        self._search_signature = inspect.signature(memory.search).parameters
        # 1.0.x takes user_id/agent_id/run_id and limit= at the top level; 2.x wants them in filters, top_k=
        self._top_level_scope = "user_id" in self._search_signature
        self.has_graph = bool(getattr(memory, "enable_graph", False)) and getattr(memory, "graph", None) is not None
        self.search_path: Literal["batch", "search"] = self._choose_path(search_path)
        provider = getattr(getattr(getattr(memory, "config", None), "vector_store", None), "provider", None)
        # 2.x search() returns a fused score (semantic + BM25 + entity boost) while threshold gates the
        # semantic one; only the batch path, or 1.0.x search(), hands back the vector store's own score.
        raw_scores = self.search_path == "batch" or self._top_level_scope
        self.capabilities = Capabilities(  # type: ignore[misc]  # per instance: depends on the memory
            writable=True,
            dates=True,
            cosine_scores=raw_scores and provider in _COSINE_PROVIDERS,
            window=False,
            native_async=self.is_async,
            lists=True,  # facts_for
            by_id=True,  # get, get_many
        )
        self._filters: dict[str, Any] = {}  # metadata filters of one drop-in call (see _view)
        self._show_expired = False
        self._last_error: BaseException | None = None
        self._dropped = _Tally()  # shared with the drop-in's views (copy.copy keeps the reference)

    @property
    def out_of_scope_dropped(self) -> int:
        """Records searches dropped because their owner ids were not plainly the caller's (a list, ...)."""
        return self._dropped.value

    def _foreign(self, record_id: Any, scope: Scope) -> None:
        self._dropped.add()
        logger.warning(
            "dropped mem0 record %s: its owner ids are not plainly those of scope %s", record_id, scope.as_dict()
        )

    def __repr__(self) -> str:
        return f"Mem0Store({type(self.memory).__name__}, search_path={self.search_path!r}, graph={self.has_graph})"

    def _choose_path(self, wanted: str) -> Literal["batch", "search"]:
        vector_store = getattr(self.memory, "vector_store", None)
        embedder = getattr(self.memory, "embedding_model", None)
        can_batch = callable(getattr(vector_store, "search_batch", None)) and callable(getattr(embedder, "embed", None))
        if wanted == "search":
            return "search"
        if wanted == "batch":
            if not can_batch:
                raise ConfigurationError(
                    "search_path='batch' needs memory.vector_store.search_batch and memory.embedding_model "
                    "(mem0ai 2.x); use search_path='search'"
                )
            if self.has_graph:
                raise ConfigurationError("graph relations come only through memory.search: use search_path='search'")
            return "batch"
        if wanted != "auto":
            raise InvalidArgumentError(f"search_path must be 'auto', 'batch' or 'search', not {wanted!r}")
        return "batch" if can_batch and not self.has_graph else "search"

    # ================================================================== the store hook

    def search_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        probes, scope = self._round_of(probes, scope)
        if not probes:
            return []
        with self._mapped_errors():
            if self.search_path == "batch":
                return self._batch_round(probes, scope, params)
            if self.is_async:
                return _run_sync(self._asearch_round(probes, scope, params))
            kwargs = self._search_kwargs(scope, params)
            answers = [self.memory.search(probe, **kwargs) for probe in probes]
            return self._from_answers(probes, answers, scope, params)

    async def asearch_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        if not (self.is_async and self.search_path == "search"):
            return await asyncio.to_thread(self.search_batch, probes, scope=scope, params=params)
        probes, scope = self._round_of(probes, scope)
        if not probes:
            return []
        with self._mapped_errors():
            return await self._asearch_round(probes, scope, params)

    def _round_of(self, probes: Sequence[str], scope: Scope | Mapping[str, str]) -> tuple[list[str], Scope]:
        """A round's probes checked and its scope one this store can filter on (both APIs)."""
        checked, owner = validate_probes(probes), Scope.coerce(scope)
        if checked:
            self._check_scope(owner)
        return checked, owner

    @contextmanager
    def _mapped_errors(self) -> Iterator[None]:
        """mem0's own failures as StoreError (the last one kept for diagnosis); pgr's pass through."""
        try:
            yield
        except (StoreError, InvalidArgumentError):
            raise
        except Exception as exc:
            self._last_error = exc
            raise StoreError(f"mem0 search failed: {type(exc).__name__}: {exc}") from exc

    def _check_scope(self, scope: Scope) -> None:
        if self.has_graph and self.search_path == "search" and scope.user_id is None:
            raise ScopeError(_GRAPH_NEEDS_USER)

    def _filters_for(self, scope: Scope) -> dict[str, Any]:
        # the scope last, so no metadata filter can widen or replace it
        return {**{k: v for k, v in self._filters.items() if k not in SCOPE_KEYS}, **scope.as_dict()}

    # ------------------------------------------------------------------ path "batch": one round trip

    def _batch_round(self, probes: list[str], scope: Scope, params: SearchParams) -> list[list[Hit]]:
        vector_store = self.memory.vector_store
        vectors = self._embed(probes)
        k_name = "limit" if "limit" in inspect.signature(vector_store.search_batch).parameters else "top_k"
        point_lists = vector_store.search_batch(
            queries=probes, vectors_list=vectors, filters=self._filters_for(scope), **{k_name: params.top_k}
        )
        if len(point_lists) != len(probes):
            raise StoreError(f"mem0 vector_store.search_batch gave {len(point_lists)} lists for {len(probes)} probes")
        out = []
        for points in point_lists:
            scored: list[tuple[Fact, float]] = []
            for point in points or []:
                if not visible_to(point.payload or {}, scope):
                    self._foreign(getattr(point, "id", None), scope)
                    continue
                fact = fact_from_point(point)
                if fact is None or (not self._show_expired and expired(point.payload or {})):
                    continue
                score = float(point.score)
                if score >= params.min_score:
                    scored.append((fact, score))
            out.append(_ranked(scored, params.top_k))
        return out

    def _embed(self, texts: list[str]) -> list[Any]:
        """mem0's own embedder: one batch call where it has ``embed_batch`` (2.x), else one call a text."""
        model = self.memory.embedding_model
        if callable(getattr(model, "embed_batch", None)):
            vectors = list(model.embed_batch(texts, "search"))
        else:
            vectors = [model.embed(text, "search") for text in texts]
        if len(vectors) != len(texts):
            raise StoreError(f"mem0 embedder gave {len(vectors)} vectors for {len(texts)} texts")
        return vectors

    # ------------------------------------------------------------------ path "search": memory.search a probe

    def _search_kwargs(self, scope: Scope, params: SearchParams) -> dict[str, Any]:
        sig = self._search_signature
        kwargs: dict[str, Any] = {"threshold": params.min_score}
        if "rerank" in sig:
            kwargs["rerank"] = False  # a configured reranker would replace the similarity scores
        if "show_expired" in sig and self._show_expired:
            kwargs["show_expired"] = True
        if self._top_level_scope:  # mem0ai 1.0.x
            kwargs.update(scope.as_dict(), limit=params.top_k)
            extra = {k: v for k, v in self._filters.items() if k not in SCOPE_KEYS}
            if extra:
                kwargs["filters"] = extra
        else:  # mem0ai 2.x: scope inside filters (top-level raises), top_k (limit is silently ignored)
            kwargs.update(filters=self._filters_for(scope), top_k=params.top_k)
        return kwargs

    async def _asearch_round(self, probes: list[str], scope: Scope, params: SearchParams) -> list[list[Hit]]:
        kwargs = self._search_kwargs(scope, params)
        answers = await asyncio.gather(*(self.memory.search(probe, **kwargs) for probe in probes))
        return await asyncio.to_thread(self._from_answers, probes, list(answers), scope, params)

    def _from_answers(
        self, probes: list[str], answers: list[Any], scope: Scope, params: SearchParams
    ) -> list[list[Hit]]:
        per_probe: list[list[tuple[Fact, float]]] = []
        relations: list[list[Mem0Fact]] = []
        for answer in answers:
            items = answer.get("results", []) if isinstance(answer, Mapping) else answer
            scored: list[tuple[Fact, float]] = []
            for item in items or []:
                if not isinstance(item, Mapping) or not visible_to(item, scope):
                    self._foreign(item.get("id") if isinstance(item, Mapping) else None, scope)
                    continue
                fact = fact_from_item(item)
                if fact is not None and item.get("score") is not None:
                    scored.append((fact, float(item["score"])))
            per_probe.append(scored)
            found = answer.get("relations") if isinstance(answer, Mapping) else None
            relations.append([r for r in (relation_fact(rel, scope) for rel in found or []) if r is not None])
        if any(relations):
            self._score_relations(probes, relations, per_probe, params.min_score)
        return [_ranked(scored, params.top_k) for scored in per_probe]

    def _score_relations(
        self,
        probes: list[str],
        relations: list[list[Mem0Fact]],
        per_probe: list[list[tuple[Fact, float]]],
        min_score: float,
    ) -> None:
        """Each relation scored by cosine(probe, its sentence): one embedding batch for the whole round."""
        sentences = sorted({r.text for rels in relations for r in rels})
        matrix = unit_rows(self._embed([*probes, *sentences]))
        probe_rows, sentence_rows = matrix[: len(probes)], dict(zip(sentences, matrix[len(probes) :], strict=True))
        for p, rels in enumerate(relations):
            for rel in {r.id: r for r in rels}.values():  # mem0 may list one relation twice
                score = float(probe_rows[p] @ sentence_rows[rel.text])
                if score >= min_score:
                    per_probe[p].append((rel, score))

    # ================================================================== facts by id

    def get_many(self, fact_ids: Sequence[str], *, scope: Scope | Mapping[str, str]) -> dict[str, Fact]:
        """fact id -> fact for those of ``fact_ids`` (mem0 memory ids) that ``scope`` may see, built as
        ``memory.search`` items are (:class:`Mem0Fact`); what :class:`pgr_core.Anticipating` asks for
        the facts it found through their cues.

        Left out: unknown ids, memories whose owner ids are not plainly ones ``scope`` allows, expired
        memories (as a search hides them) and graph relations (they have no memory id). mem0 has no
        batch get, so this is one ``memory.get`` per id (run concurrently on an ``AsyncMemory``).
        """
        scope = Scope.coerce(scope)
        ids = [i for i in dict.fromkeys(str(i) for i in fact_ids) if not i.startswith(_RELATION_ID)]
        if not ids:
            return {}
        try:
            items = _run_sync(self._aget_items(ids)) if self.is_async else [self.memory.get(i) for i in ids]
        except (StoreError, InvalidArgumentError):
            raise
        except Exception as exc:
            self._last_error = exc
            raise StoreError(f"mem0 get failed: {type(exc).__name__}: {exc}") from exc
        out: dict[str, Fact] = {}
        for fact_id, item in zip(ids, items, strict=True):
            if not isinstance(item, Mapping) or not visible_to(item, scope):
                continue
            if not self._show_expired and expired(item):
                continue
            fact = fact_from_item(item)
            if fact is not None and fact.id == fact_id:
                out[fact_id] = fact
        return out

    def get(self, fact_id: str, *, scope: Scope | Mapping[str, str]) -> Fact | None:
        """The memory ``fact_id`` as a fact if ``scope`` may see it, else None: :meth:`get_many` of that one id."""
        return self.get_many([fact_id], scope=scope).get(str(fact_id))

    async def _aget_items(self, ids: list[str]) -> list[Any]:
        return list(await asyncio.gather(*(self.memory.get(i) for i in ids)))

    # ================================================================== every fact of a scope

    def facts_for(self, scope: Scope | Mapping[str, str]) -> list[Fact]:
        """Every memory ``scope`` may see, built as ``memory.search`` items are (:class:`Mem0Fact`):
        what :meth:`pgr_core.Anticipating.build` backfills cues for. Reads only; nothing is written.

        ``memory.get_all`` with the scope the way the installed mem0 wants it (2.x: inside ``filters``,
        ``top_k=``; 1.0.x: top-level ids, ``limit=``). mem0 has no offset, so a page that comes back
        full is asked for again with twice the limit, until one comes back short. Expired memories
        are left out as a search leaves them out, and so are graph relations (they have no memory id).
        A record whose owner ids are not plainly ones ``scope`` allows is dropped and counted in
        ``out_of_scope_dropped``, as a search does.
        """
        scope = Scope.coerce(scope)
        self._check_scope(scope)
        try:
            items = _run_sync(self._aget_all(scope)) if self.is_async else self._get_all(scope)
        except (StoreError, InvalidArgumentError):
            raise
        except Exception as exc:
            self._last_error = exc
            raise StoreError(f"mem0 get_all failed: {type(exc).__name__}: {exc}") from exc
        found: dict[str, Fact] = {}
        for item in items:
            if not isinstance(item, Mapping) or not visible_to(item, scope):
                self._foreign(item.get("id") if isinstance(item, Mapping) else None, scope)
                continue
            if not self._show_expired and expired(item):
                continue
            fact = fact_from_item(item)
            if fact is not None:
                found.setdefault(fact.id, fact)
        return list(found.values())

    def _get_all_kwargs(self, scope: Scope, limit: int) -> dict[str, Any]:
        sig = inspect.signature(self.memory.get_all).parameters
        kwargs: dict[str, Any] = {}
        if "show_expired" in sig:
            kwargs["show_expired"] = True  # mem0 then fetches exactly `limit`: a short page is the last
        if "user_id" in sig:  # mem0ai 1.0.x
            kwargs.update(scope.as_dict(), limit=limit)
            extra = {k: v for k, v in self._filters.items() if k not in SCOPE_KEYS}
            if extra:
                kwargs["filters"] = extra
        else:  # mem0ai 2.x: scope inside filters (top-level raises), top_k
            kwargs.update(filters=self._filters_for(scope), top_k=limit)
        return kwargs

    def _get_all(self, scope: Scope) -> list[Any]:
        limit = _LIST_PAGE
        while True:
            items = _items(self.memory.get_all(**self._get_all_kwargs(scope, limit)))
            if len(items) < limit:
                return items
            limit *= 2

    async def _aget_all(self, scope: Scope) -> list[Any]:
        limit = _LIST_PAGE
        while True:
            items = _items(await self.memory.get_all(**self._get_all_kwargs(scope, limit)))
            if len(items) < limit:
                return items
            limit *= 2

    # ================================================================== writing

    def add_facts(self, facts: Sequence[Fact]) -> list[str]:
        """Store facts through mem0's own ``add(..., infer=False)`` and return mem0's ids, in order.

        Each fact goes in with its scope as ``user_id=``/``agent_id=``/``run_id=``, its metadata, type and
        turn place in ``metadata``, and its date as mem0's ``created_at``. Consecutive facts that share a
        scope and metadata go in one ``add`` call (mem0 stores each message as its own memory). mem0 makes
        its own ids; the facts' ids are not kept. mem0 needs its LLM configured even with ``infer=False``
        (1.0.x graph memory calls it to extract relations).
        """
        if self.is_async:
            return _run_sync(self.aadd_facts(facts))
        ids: list[str] = []
        for texts, kwargs in _add_calls(facts):
            ids += self._added(texts, self._add(texts, kwargs))
        return ids

    async def aadd_facts(self, facts: Sequence[Fact]) -> list[str]:
        """Async twin of :meth:`add_facts`."""
        ids: list[str] = []
        for texts, kwargs in _add_calls(facts):
            if self.is_async:
                try:
                    answer = await self.memory.add([{"role": "user", "content": t} for t in texts], **kwargs)
                except Exception as exc:
                    raise StoreError(f"mem0 add failed: {type(exc).__name__}: {exc}") from exc
            else:
                answer = await asyncio.to_thread(self._add, texts, kwargs)
            ids += self._added(texts, answer)
        return ids

    def _add(self, texts: list[str], kwargs: dict[str, Any]) -> Any:
        try:
            return self.memory.add([{"role": "user", "content": t} for t in texts], **kwargs)
        except Exception as exc:
            raise StoreError(f"mem0 add failed: {type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _added(texts: list[str], answer: Any) -> list[str]:
        results = answer.get("results", []) if isinstance(answer, Mapping) else answer
        ids = [str(r["id"]) for r in results or [] if r.get("event", "ADD") == "ADD"]
        if len(ids) != len(texts):
            raise StoreError(f"mem0 add stored {len(ids)} memories for {len(texts)} facts: {answer!r}")
        return ids

    # ================================================================== the drop-in: mem0's search, by PGR

    @property
    def pgr(self) -> PGR:
        """The PGR over this store (built on first use with ``llm`` and the PGR options)."""
        if self._pgr is None:
            self._pgr = PGR(self, llm=self.llm, **self._pgr_options)
        return self._pgr

    def search(self, query: str, **kwargs: Any) -> dict[str, Any]:
        """mem0's ``search``, answered by PGR: the same keyword arguments, mem0's result shape.

        ``top_k`` (2.x) or ``limit`` (1.0.x) caps the answer as in mem0: at most that many
        ``"results"``, the first ones of PGR's ranking (R*, fused rank over every probe) that pass
        ``threshold``. It is also K of the query's own probe. ``threshold`` drops facts whose best cosine
        is below it, as mem0 does, before the cut, so facts prospection found take the places of query
        hits it drops. ``max_facts`` (a PGR option) can cut R* shorter still. ``filters`` carries the
        scope and any metadata filters; every probe is searched under both. With graph memory,
        ``"relations"`` lists the relations PGR found, at most ``limit`` of them too, as in mem0.
        ``explain=True`` adds ``score_details`` with where each fact was found. A store failure on the
        query itself raises :class:`~pgr_core.StoreError`; a failure later returns what was found.
        """
        call = self._dropin(kwargs)
        if call.pgr is None:  # top_k=0
            return self._shaped(None, call)
        result = call.pgr.retrieve(query, scope=call.scope)
        return self._shaped(result, call)

    async def asearch(self, query: str, **kwargs: Any) -> dict[str, Any]:
        """Async twin of :meth:`search` (``await store.asearch(...)`` where you had
        ``await async_memory.search(...)``)."""
        call = self._dropin(kwargs)
        if call.pgr is None:  # top_k=0
            return self._shaped(None, call)
        result = await call.pgr.aretrieve(query, scope=call.scope)
        return self._shaped(result, call)

    def _dropin(self, kwargs: dict[str, Any]) -> _DropIn:
        sig = self._search_signature
        known = {n for n, p in sig.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and n != "query"}
        kwargs = dict(kwargs)
        if "limit" in kwargs and "limit" not in known:
            warnings.warn("mem0 2.x ignores limit= (and so does pgr): pass top_k=", stacklevel=3)
            kwargs.pop("limit")
        top_level = {k: kwargs.pop(k) for k in SCOPE_KEYS if k in kwargs}
        if top_level and not self._top_level_scope:
            raise ScopeError(
                f"mem0 2.x rejects top-level {sorted(top_level)} in search(): pass filters={{'user_id': '...'}}"
            )
        unexpected = sorted(set(kwargs) - known)
        if unexpected:
            raise TypeError(f"search() got unexpected keyword argument(s) {unexpected}")
        if kwargs.get("reference_date") is not None:
            raise InvalidArgumentError("reference_date is a mem0 platform feature; mem0 open source rejects it too")
        filters = dict(kwargs.get("filters") or {})
        filters.update(kwargs.get("metadata_filters") or {})
        ids = {k: filters.pop(k) for k in SCOPE_KEYS if k in filters}
        for key, value in top_level.items():
            if value is not None and ids.get(key, value) != value:
                raise ScopeError(f"{key} is {value!r} at the top level but {ids[key]!r} in filters")
            if value is not None:
                ids[key] = value
        scope = Scope.coerce({k: str(v) for k, v in ids.items() if v is not None})
        k_name = "limit" if self._top_level_scope else "top_k"
        top_k = kwargs.get(k_name, _default(sig, k_name, 20))
        threshold = kwargs.get("threshold", _default(sig, "threshold", None))
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise InvalidArgumentError(f"{k_name} must be an integer >= 0, got {top_k!r}")
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int | float)):
            raise InvalidArgumentError(f"threshold must be a number or None, got {threshold!r}")
        view = self._view(filters, bool(kwargs.get("show_expired", False)))
        options = {**self._pgr_options, "query_top_k": max(int(top_k), 1)}
        pgr = PGR(view, llm=self.llm, **options) if top_k else None
        return _DropIn(view, pgr, scope, int(top_k), threshold, bool(kwargs.get("explain", False)))

    def _view(self, filters: dict[str, Any], show_expired: bool) -> Mem0Store:
        """This store with one call's metadata filters and expiry setting (the memory is shared)."""
        if not filters and not show_expired:
            return self
        view = copy.copy(self)
        view._filters, view._show_expired, view._pgr = dict(filters), show_expired, None
        return view

    def _shaped(self, result: RetrievalResult | None, call: _DropIn) -> dict[str, Any]:
        if result is not None and result.trace.stop_reason == "store_error" and not result.facts:
            error = call.view._last_error
            message = "; ".join(result.trace.errors) or "mem0 search failed"
            raise StoreError(message) from error
        items: list[dict[str, Any]] = []
        relations: list[dict[str, Any]] = []
        for found in result.facts if result is not None else []:
            fact = found.fact
            if isinstance(fact, Mem0Fact) and fact.is_relation:
                relations.append(dict(fact.record))
                continue
            if call.threshold is not None and found.score < call.threshold:
                continue
            item = dict(fact.record) if isinstance(fact, Mem0Fact) else _item_of(fact)
            item["score"] = found.score
            if call.explain:
                item["score_details"] = _details(found)
            items.append(item)
        # at most top_k / limit of each, as mem0 answers (1.0.x passes its limit to the graph search
        # too): the head of R*, which is ranked best first
        out: dict[str, Any] = {"results": items[: call.top_k]}
        if self.has_graph:
            out["relations"] = relations[: call.top_k]
        return out


@dataclass(frozen=True)
class _DropIn:
    """One drop-in call, its arguments checked: the store view it searches, the PGR that runs it."""

    view: Mem0Store
    pgr: PGR | None  # None when top_k is 0: nothing to search
    scope: Scope
    top_k: int
    threshold: float | None
    explain: bool


# ====================================================================== helpers


class _Tally:
    """A thread-safe counter a store and its views share."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self, amount: int = 1) -> None:
        with self._lock:
            self.value += amount


def _ranked(scored: list[tuple[Fact, float]], top_k: int) -> list[Hit]:
    """Best first, one hit per fact, at most K."""
    best: dict[str, tuple[Fact, float]] = {}
    for fact, score in scored:
        if fact.id not in best or score > best[fact.id][1]:
            best[fact.id] = (fact, score)
    ordered = sorted(best.values(), key=lambda pair: -pair[1])[:top_k]
    return [Hit(fact=fact, score=score, rank=rank) for rank, (fact, score) in enumerate(ordered)]


def _items(answer: Any) -> list[Any]:
    """The memories of a ``get_all`` answer: ``{"results": [...]}`` (relations aside) or a bare list."""
    items = answer.get("results", []) if isinstance(answer, Mapping) else answer
    return list(items or [])


def _add_calls(facts: Sequence[Fact]) -> list[tuple[list[str], dict[str, Any]]]:
    """Group consecutive facts with one scope and one metadata into the ``Memory.add`` calls to make."""
    calls: list[tuple[list[str], dict[str, Any]]] = []
    for i, fact in enumerate(facts):
        if not isinstance(fact, Fact):
            raise InvalidArgumentError(f"item {i} is a {type(fact).__name__}, not a Fact")
        if not isinstance(fact.text, str) or not fact.text.strip():
            raise InvalidArgumentError(f"fact {fact.id!r} has empty text")
        kwargs = {**fact.scope.as_dict(), "metadata": write_metadata(fact), "infer": False}
        if calls and calls[-1][1] == kwargs:
            calls[-1][0].append(fact.text)
        else:
            calls.append(([fact.text], kwargs))
    return calls


def _default(sig: Mapping[str, inspect.Parameter], name: str, fallback: Any) -> Any:
    param = sig.get(name)
    return fallback if param is None or param.default is inspect.Parameter.empty else param.default


def _item_of(fact: Fact) -> dict[str, Any]:
    return {
        "id": fact.id,
        "memory": fact.text,
        "metadata": dict(fact.metadata) or None,
        "created_at": fact.date.isoformat() if fact.date else None,
        "updated_at": fact.updated_at.isoformat() if fact.updated_at else None,
        **fact.scope.as_dict(),
    }


def _details(found: FoundFact) -> dict[str, Any]:
    return {
        "semantic_score": found.score,
        "pgr_rank_score": found.rank_score,
        "pgr_round": found.round,
        "pgr_probe": found.probe,
        "pgr_step_id": found.step_id,
        "pgr_probes_hit": found.probes_hit,
    }


def _run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine from sync code, also when an event loop is already running in this thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
