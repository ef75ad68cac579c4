"""PGR as a LlamaIndex retriever: :class:`ProspectionRetriever`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from llama_index.core import VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.llms import LLM as LlamaLLM
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from pgr_core._dates import DateLike
from pgr_core.errors import InvalidArgumentError
from pgr_core.models.llm import LLM
from pgr_core.observability.trace import FoundFact, RetrievalResult
from pgr_core.policy.pgr import PGR
from pgr_core.policy.prospectors import Prospector
from pgr_core.stores.contract import Store
from pgr_core.types import Scope

from .llm import LlamaIndexLLM
from .store import RetrieverStore

__all__ = ["TRACE_KEYS", "ProspectionRetriever"]

#: The metadata keys a returned node carries for pgr's bookkeeping; never shown to an LLM or embedder.
TRACE_KEYS = (
    "pgr_rank",  # position in R*
    "pgr_score",  # best similarity any probe gave the fact (0.0 for a window neighbour)
    "pgr_rank_score",  # the fused score R* is ordered by
    "pgr_round",  # the round that first found it
    "pgr_phase",  # that round's phase: initial, personalized...
    "pgr_probe",  # the probe text that found it
    "pgr_step_id",  # the imagined step behind that probe (None: the query itself)
    "pgr_step",  # that step's text
    "pgr_dimension",  # that step's dimension (timing, health...)
    "pgr_via",  # "hit" or "neighbour" (brought in by the temporal window)
    "pgr_probes_hit",  # how many probes returned it directly
    "pgr_strategy",  # tot, cot, feedback...
    "pgr_summary",  # the prospection summary (first node, or every node)
)


class ProspectionRetriever(BaseRetriever):
    """Prospection-Guided Retrieval behind LlamaIndex's ``BaseRetriever``: drops into
    ``RetrieverQueryEngine``, chat engines, and anything else that takes a retriever.

    >>> retriever = ProspectionRetriever(index, llm, scope=Scope(user_id="u1"), strategy="tot")  # doctest: +SKIP
    >>> engine = RetrieverQueryEngine.from_args(retriever, llm=llm)                              # doctest: +SKIP

    - ``store_or_retriever``: a pgr :class:`~pgr_core.stores.contract.Store`, or a ``VectorStoreIndex`` /
      LlamaIndex retriever, wrapped in :class:`~pgr_adapters.llamaindex.RetrieverStore` with
      ``store_options`` (``scope_filter=``, ``single_tenant_scope=``, ``cosine_scores=``...).
    - ``llm``: the generator that imagines the steps: any LlamaIndex ``LLM`` (wrapped in
      :class:`~pgr_adapters.llamaindex.LlamaIndexLLM`) or a pgr ``LLM``. ``None``: no LLM, and the
      default strategy is ``"feedback"``. ``Settings.llm`` is never picked up silently.
    - ``scope``: whose memories every query searches; required (ScopeError without it). One retriever
      per user session, as with LlamaIndex's own user-scoped retrievers; build another for another user.
    - ``date``: the query date for prospection (a date, an ISO string, or a callable returning one,
      e.g. ``datetime.now``); ``None``: undated.
    - ``strategy`` and ``pgr_options``: as for :class:`~pgr_core.PGR` (``top_k``, ``min_score``,
      ``max_rounds``, ``window``, ``max_facts``...).
    - ``summary``: where the prospection summary goes in node metadata: ``"first"`` node, ``"each"``
      node, or ``"none"``.
    - ``visible_metadata``: the metadata keys an LLM reading the nodes sees (default ``date`` and
      ``type``); every other key, pgr's trace keys (:data:`TRACE_KEYS`) and the source node's metadata
      (scope keys, session...), is listed in ``excluded_llm_metadata_keys`` and
      ``excluded_embed_metadata_keys``.

    Returns R* ranked as ``NodeWithScore``: a ``TextNode`` per fact (id = the fact's id, text = the fact),
    ``score`` = the best similarity any probe gave it. Ids in R* are unique, so LlamaIndex's de-duplication
    of node ids drops nothing. The whole result (trace, summary, usage) of the latest query is
    ``last_result``; with several queries in flight at once on one retriever, read the node metadata.
    """

    def __init__(
        self,
        store_or_retriever: Store | BaseRetriever | VectorStoreIndex,
        llm: LlamaLLM | LLM | None = None,
        *,
        scope: Scope | Mapping[str, str] | None = None,
        strategy: str | Prospector | None = None,
        date: DateLike | Callable[[], DateLike] | None = None,
        summary: Literal["first", "each", "none"] = "first",
        visible_metadata: Sequence[str] = ("date", "type"),
        store_options: Mapping[str, Any] | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
        **pgr_options: Any,
    ) -> None:
        self.scope = Scope.coerce(scope)  # ScopeError when missing: pgr never searches unscoped
        if summary not in ("first", "each", "none"):
            raise InvalidArgumentError(f"summary must be 'first', 'each' or 'none', got {summary!r}")
        if isinstance(store_or_retriever, Store):
            if store_options:
                raise InvalidArgumentError("store_options apply only when a LlamaIndex retriever or index is given")
            store = store_or_retriever
        else:
            store = RetrieverStore(store_or_retriever, **dict(store_options or {}))
        self.llm = _as_pgr_llm(llm)
        self.pgr = PGR(store, self.llm, strategy, **pgr_options)
        self.date = date
        self.summary = summary
        self.visible_metadata = tuple(visible_metadata)
        self.last_result: RetrievalResult | None = None
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    @property
    def store(self) -> Store:
        return self.pgr.store

    def __repr__(self) -> str:
        return f"ProspectionRetriever({self.pgr!r}, scope={self.scope.as_dict()})"

    # ------------------------------------------------------------------ BaseRetriever

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        result = self.pgr.retrieve(query_bundle.query_str, scope=self.scope, date=self._query_date())
        self.last_result = result
        return self.nodes(result)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        result = await self.pgr.aretrieve(query_bundle.query_str, scope=self.scope, date=self._query_date())
        self.last_result = result
        return self.nodes(result)

    # ------------------------------------------------------------------ R* as nodes

    def nodes(self, result: RetrievalResult) -> list[NodeWithScore]:
        """R* as scored ``TextNode``s carrying the trace in metadata hidden from LLMs and embedders."""
        steps = {s.id: s for s in result.trace.steps}
        phases = {r.index: r.phase for r in result.trace.rounds}
        out = []
        for rank, found in enumerate(result.facts):
            step = steps.get(found.step_id) if found.step_id else None
            trace: dict[str, Any] = {
                "pgr_rank": rank,
                "pgr_score": round(found.score, 6),
                "pgr_rank_score": round(found.rank_score, 6),
                "pgr_round": found.round,
                "pgr_phase": phases.get(found.round),
                "pgr_probe": found.probe,
                "pgr_step_id": found.step_id,
                "pgr_step": step.text if step else None,
                "pgr_dimension": step.dimension if step else None,
                "pgr_via": found.via,
                "pgr_probes_hit": found.probes_hit,
                "pgr_strategy": result.trace.strategy,
            }
            if self.summary == "each" or (self.summary == "first" and rank == 0):
                trace["pgr_summary"] = result.summary
            out.append(NodeWithScore(node=self._node(found, trace), score=found.score))
        return out

    def _node(self, found: FoundFact, trace: Mapping[str, Any]) -> TextNode:
        fact = found.fact
        metadata: dict[str, Any] = {k: v for k, v in fact.metadata.items() if not k.startswith("pgr_")}
        metadata.update(
            (k, v)
            for k, v in (
                ("date", fact.date.isoformat() if fact.date else None),
                ("type", fact.type),
                *fact.scope.as_dict().items(),
                ("session_id", fact.session_id),
                ("position", fact.position),
            )
            if v is not None
        )
        metadata.update(trace)
        hidden = [k for k in metadata if k not in self.visible_metadata]
        return TextNode(
            id_=fact.id,
            text=fact.text,
            metadata=metadata,
            excluded_llm_metadata_keys=hidden,
            excluded_embed_metadata_keys=hidden,
        )

    def _query_date(self) -> DateLike | None:
        return self.date() if callable(self.date) else self.date


def _as_pgr_llm(llm: Any) -> LLM | None:
    if llm is None or isinstance(llm, LLM):
        return llm
    if isinstance(llm, LlamaLLM):
        return LlamaIndexLLM(llm)
    raise InvalidArgumentError(f"llm must be a LlamaIndex LLM or a pgr LLM, not {type(llm).__name__}")
