"""LlamaIndex pieces for the baselines: pgr's LLM as a LlamaIndex LLM, and a retriever over a pgr store.

Imported only by the ``query-fusion`` and ``hyde`` methods; needs ``pip install 'pgr[llamaindex]'``.
"""

from __future__ import annotations

from typing import Any

from pgr_core.errors import ConfigurationError
from pgr_core.models.llm import LLM
from pgr_core.stores.contract import Store
from pgr_core.types import Scope, SearchParams

try:
    from llama_index.core.indices.query.query_transform.base import HyDEQueryTransform
    from llama_index.core.llms import CompletionResponse, CompletionResponseGen, CustomLLM, LLMMetadata
    from llama_index.core.llms.callbacks import llm_completion_callback
    from llama_index.core.retrievers import BaseRetriever, QueryFusionRetriever
    from llama_index.core.retrievers.fusion_retriever import FUSION_MODES
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError as exc:  # pragma: no cover - exercised where llama-index-core is absent
    raise ConfigurationError(
        "the query-fusion and hyde baselines need llama-index-core: pip install 'pgr[llamaindex]'"
    ) from exc

__all__ = ["PgrLlamaLLM", "StoreRetriever", "fusion_retriever", "hyde_transform"]


class PgrLlamaLLM(CustomLLM):
    """A LlamaIndex LLM that sends each prompt to a pgr :class:`~pgr_core.models.llm.LLM` (one user message)."""

    max_tokens: int = 256

    def __init__(self, llm: LLM, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._pgr_llm = llm

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name=getattr(self._pgr_llm, "model", "pgr"), num_output=self.max_tokens)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        reply = self._pgr_llm.complete([{"role": "user", "content": prompt}], max_tokens=self.max_tokens)
        return CompletionResponse(text=reply.text)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        text = self.complete(prompt, formatted=formatted, **kwargs).text

        def gen() -> CompletionResponseGen:
            yield CompletionResponse(text=text, delta=text)

        return gen()


class StoreRetriever(BaseRetriever):
    """A LlamaIndex retriever bound to one scope of a pgr store. Window neighbours go to ``neighbours``
    (fact id -> neighbour ids) instead of the node list, so fusion ranks direct hits only."""

    def __init__(
        self,
        store: Store,
        scope: Scope,
        params: SearchParams,
        neighbours: dict[str, list[str]],
        counter: dict[str, int],
    ) -> None:
        super().__init__()
        self._store, self._scope, self._params = store, scope, params
        self._neighbours, self._counter = neighbours, counter

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self._counter["calls"] += 1
        hits = self._store.search_batch([query_bundle.query_str], scope=self._scope, params=self._params)[0]
        nodes = []
        for h in hits:
            if h.neighbour_of is not None:
                self._neighbours.setdefault(h.neighbour_of, []).append(h.fact.id)
            else:
                nodes.append(NodeWithScore(node=TextNode(id_=h.fact.id, text=h.fact.text), score=h.score))
        return nodes


def hyde_transform(llm: LLM) -> HyDEQueryTransform:
    return HyDEQueryTransform(llm=PgrLlamaLLM(llm), include_original=True)


def fusion_retriever(
    store: Store,
    llm: LLM,
    *,
    scope: Scope,
    top_k: int,
    window: int,
    neighbours: dict[str, list[str]],
    num_queries: int,
    out_k: int,
) -> tuple[QueryFusionRetriever, dict[str, int]]:
    counter = {"calls": 0}
    base = StoreRetriever(store, scope, SearchParams(top_k=top_k, min_score=0.0, window=window), neighbours, counter)
    fusion = QueryFusionRetriever(
        [base],
        llm=PgrLlamaLLM(llm),
        mode=FUSION_MODES.RECIPROCAL_RANK,
        similarity_top_k=out_k,
        num_queries=num_queries,
        use_async=False,
    )
    return fusion, counter
