"""The built-in plugin: the embedded store, the OpenAI-compatible LLM and the two embedders."""

from __future__ import annotations

from typing import Any

from .hookspecs import Register, hookimpl


def _memory_store(path: str | None = None, embedder: Any = None) -> Any:
    from .memory import InMemoryStore

    return InMemoryStore.load(path, embedder=embedder) if path else InMemoryStore(embedder=embedder)


def _openai_llm(**options: Any) -> Any:
    from .llm import OpenAICompatible

    return OpenAICompatible(**options)


def _minilm(**options: Any) -> Any:
    from .embedders import MiniLMEmbedder

    return MiniLMEmbedder(**options)


def _hashing(**options: Any) -> Any:
    from .embedders import HashingEmbedder

    return HashingEmbedder(**options)


@hookimpl
def register_stores(register: Register) -> None:
    register("memory", _memory_store)


@hookimpl
def register_llms(register: Register) -> None:
    register("openai", _openai_llm)


@hookimpl
def register_embedders(register: Register) -> None:
    register("minilm", _minilm)
    register("hashing", _hashing)
