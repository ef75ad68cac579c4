"""The built-in plugin: the embedded stores, the OpenAI-compatible LLM and the two embedders.

A store path names one of two embedded stores (:func:`open_store`): a directory is an
:class:`~pgr_core.stores.edge.EdgeStore` (Qdrant's engine in-process, durable on every write; what the CLI
creates), a ``.pgr`` file an :class:`~pgr_core.stores.memory.InMemoryStore` saved whole (tests, throwaway
use; ``pgr store import`` moves one into a directory store).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pgr_core.errors import ConfigurationError
from pgr_core.plugins.hookspecs import Register, hookimpl


def is_file_store(path: str | Path) -> bool:
    """True when ``path`` names an InMemoryStore file (a ``.pgr`` suffix, or an existing file)."""
    path = Path(path)
    return path.suffix == ".pgr" or path.is_file()


def open_store(
    path: str | Path, embedder: Any = None, *, create: bool = False, lock_timeout_s: float | None = 30.0
) -> Any:
    """The embedded store at ``path``: an EdgeStore directory, or an InMemoryStore ``.pgr`` file.

    ``create``: make a new, empty store when there is none (else a ConfigurationError says how to
    build one). An EdgeStore is this process's own until it is closed; another process waits up to
    ``lock_timeout_s`` for it.
    """
    path = Path(path)
    if is_file_store(path):
        from pgr_core.stores.memory import InMemoryStore

        if path.exists():
            return InMemoryStore.load(path, embedder=embedder)
        if not create:
            raise ConfigurationError(f"no store file at {path}; build one with `pgr ingest ... --out {path}`")
        return InMemoryStore(embedder=embedder)
    if not path.exists() and not create:
        raise ConfigurationError(
            f"no store at {path}; build one with `pgr ingest ... --out {path}` or `pgr demo --save-store {path}`"
        )
    from pgr_core.stores.edge import EdgeStore

    return EdgeStore.open(path, embedder=embedder, create=create, lock_timeout_s=lock_timeout_s)


def with_cues(store: Any, path: str | Path, *, cues: bool | None = None, lock_timeout_s: float | None = 30.0) -> Any:
    """``store`` (opened from ``path``) as an :class:`~pgr_core.anticipation.anticipating.Anticipating` when it has a
    cue index (``cues=None``), always (``True``: the index is created), or never (``False``)."""
    from pgr_core.anticipation.anticipating import Anticipating, cue_path_for

    where = cue_path_for(path)
    if cues is False or (cues is None and not where.is_dir()):
        return store
    from pgr_core.stores.edge import EdgeStore

    index = EdgeStore.open(where, embedder=store.embedder, create=True, lock_timeout_s=lock_timeout_s)
    return Anticipating(store, cues=index)


@contextmanager
def opened_store(
    path: str | Path,
    embedder: Any = None,
    *,
    create: bool = False,
    lock_timeout_s: float | None = 30.0,
    cues: bool | None = None,
) -> Iterator[Any]:
    """:func:`open_store` for a ``with`` block: a directory store is closed (its lock released) at the end.
    A store with a cue index (``pgr cues build``) comes wrapped in Anticipating (see :func:`with_cues`)."""
    store = open_store(path, embedder, create=create, lock_timeout_s=lock_timeout_s)
    try:
        store = with_cues(store, path, cues=cues, lock_timeout_s=lock_timeout_s)
    except BaseException:
        close = getattr(store, "close", None)
        if callable(close):
            close()
        raise
    try:
        yield store
    finally:
        close = getattr(store, "close", None)
        if callable(close):
            close()


def save_copy(store: Any, path: str | Path) -> Path:
    """Write every fact of the InMemoryStore ``store`` (with its vectors) to a store at ``path``: a
    ``.pgr`` file, or a new EdgeStore directory (closed again when written)."""
    path = Path(path)
    if is_file_store(path):
        return Path(store.save(path))
    with opened_store(path, store.embedder, create=True) as target:
        target.add_from(store)
    return path


def _memory_store(path: str | None = None, embedder: Any = None) -> Any:
    from pgr_core.stores.memory import InMemoryStore

    return InMemoryStore.load(path, embedder=embedder) if path else InMemoryStore(embedder=embedder)


def _edge_store(path: str, embedder: Any = None, **options: Any) -> Any:
    from pgr_core.stores.edge import EdgeStore

    return EdgeStore.open(path, embedder=embedder, **options)


def _openai_llm(**options: Any) -> Any:
    from pgr_core.models.llm import OpenAICompatible

    return OpenAICompatible(**options)


def _minilm(**options: Any) -> Any:
    from pgr_core.models.embedders import MiniLMEmbedder

    return MiniLMEmbedder(**options)


def _hashing(**options: Any) -> Any:
    from pgr_core.models.embedders import HashingEmbedder

    return HashingEmbedder(**options)


@hookimpl
def register_stores(register: Register) -> None:
    register("memory", _memory_store)
    register("edge", _edge_store)


@hookimpl
def register_llms(register: Register) -> None:
    register("openai", _openai_llm)


@hookimpl
def register_embedders(register: Register) -> None:
    register("minilm", _minilm)
    register("hashing", _hashing)
