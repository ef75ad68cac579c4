"""The pgr plugin for LlamaIndex: registers the ``llamaindex`` store and LLM factories.

Imports only pgr_core; LlamaIndex is imported when a factory is called.
"""

from __future__ import annotations

from typing import Any

from pgr_core.errors import ConfigurationError
from pgr_core.plugins.hookspecs import Register, hookimpl

REQUIRES = ("llama_index.core",)
EXTRA = "llamaindex"


def _import(name: str) -> Any:
    try:
        from . import llm, store
    except ImportError as exc:
        raise ConfigurationError(
            f"the llamaindex plugin needs LlamaIndex (llama-index-core): pip install 'pgr[{EXTRA}]' ({exc})"
        ) from exc
    return {"RetrieverStore": store.RetrieverStore, "LlamaIndexLLM": llm.LlamaIndexLLM}[name]


def make_store(retriever: Any = None, **options: Any) -> Any:
    """``registry.store("llamaindex", retriever=index_or_retriever, **RetrieverStore options)``."""
    cls = _import("RetrieverStore")
    if retriever is None:
        raise ConfigurationError("the llamaindex store needs retriever=<a LlamaIndex retriever or VectorStoreIndex>")
    return cls(retriever, **options)


def make_llm(llm: Any = None, **options: Any) -> Any:
    """``registry.llm("llamaindex", llm=<a LlamaIndex LLM>, **LlamaIndexLLM options)``."""
    cls = _import("LlamaIndexLLM")
    if llm is None:
        raise ConfigurationError("the llamaindex LLM needs llm=<a LlamaIndex LLM>")
    return cls(llm, **options)


@hookimpl
def register_stores(register: Register) -> None:
    register("llamaindex", make_store)


@hookimpl
def register_llms(register: Register) -> None:
    register("llamaindex", make_llm)
