"""pgr's embedders behind LlamaIndex's embedding interface."""

from __future__ import annotations

from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import PrivateAttr

from pgr_core.models.embedders import Embedder


class MiniLMEmbedding(BaseEmbedding):
    """A pgr :class:`~pgr_core.models.embedders.Embedder` (usually MiniLM) as a LlamaIndex embed model,
    so an index and pgr's probe hygiene share one model, loaded from its package, never a hub."""

    _embedder: Any = PrivateAttr()

    def __init__(self, embedder: Embedder, *, embed_batch_size: int = 64, **kwargs: Any) -> None:
        super().__init__(
            model_name=getattr(embedder, "name", "pgr-embedder"), embed_batch_size=embed_batch_size, **kwargs
        )
        self._embedder = embedder

    @classmethod
    def class_name(cls) -> str:
        return "MiniLMEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._embedder.embed([query])[0].tolist()

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_query_embedding(text)

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._embedder.embed(texts).tolist()

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._get_text_embeddings(texts)
