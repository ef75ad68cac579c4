"""pgr on LlamaIndex (``pip install 'pgr[llamaindex]'``), both ways round.

- :class:`RetrieverStore`: any LlamaIndex retriever (or ``VectorStoreIndex``) as a pgr store, so PGR
  prospects over the index you already have. One probe is one ``retrieve`` call; async runs a round's
  probes concurrently.
- :class:`ProspectionRetriever`: PGR as a LlamaIndex ``BaseRetriever``, for ``RetrieverQueryEngine``,
  chat engines and anything that takes a retriever; the trace rides in node metadata hidden from LLMs.
- :class:`LlamaIndexLLM`: any LlamaIndex ``LLM`` as pgr's generator.
- :class:`MiniLMEmbedding`: pgr's MiniLM (or any pgr embedder) as a LlamaIndex embed model.

Drop the retriever into a query engine::

    from llama_index.core.query_engine import RetrieverQueryEngine
    from pgr_adapters.llamaindex import ProspectionRetriever
    from pgr_core import Scope

    retriever = ProspectionRetriever(index, llm, scope=Scope(user_id="alice"), strategy="tot")
    engine = RetrieverQueryEngine.from_args(retriever, llm=llm)
    print(engine.query("Should I join a five-a-side team this summer?"))

Importing this package needs no LlamaIndex; the names above import it on first use and raise
:class:`~pgr_core.errors.ConfigurationError` naming the extra when it is missing.
"""

from __future__ import annotations

import importlib
from typing import Any

from pgr_core.errors import ConfigurationError

__all__ = ["LlamaIndexLLM", "MiniLMEmbedding", "ProspectionRetriever", "RetrieverStore"]

_HOMES = {
    "LlamaIndexLLM": ".llm",
    "MiniLMEmbedding": ".embedding",
    "ProspectionRetriever": ".retriever",
    "RetrieverStore": ".store",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(home, __name__)
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "llama_index":
            raise
        raise ConfigurationError(
            f"{name} needs LlamaIndex (llama-index-core), which is not installed: pip install 'pgr[llamaindex]'"
        ) from exc
    return getattr(module, name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
