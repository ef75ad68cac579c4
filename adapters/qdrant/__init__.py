"""pgr adapter for Qdrant: an existing collection as a pgr store (``pip install 'pgr[qdrant]'``).

>>> from pgr_adapters.qdrant import QdrantStore                          # doctest: +SKIP
>>> store = QdrantStore(QdrantClient(path="qdrant_data"), "memories", embedder=MiniLMEmbedder())  # doctest: +SKIP

Importing this package needs only pgr_core; the names below import qdrant-client when first used.
"""

from __future__ import annotations

from typing import Any

from pgr_core.errors import ConfigurationError

__all__ = ["CollectionLayout", "DEFAULT_SCOPE_FIELDS", "QdrantStore", "TEXT_KEYS"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from . import store
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "qdrant_client":
            raise
        raise ConfigurationError(f"pgr_adapters.qdrant.{name} needs qdrant-client: pip install 'pgr[qdrant]'") from exc
    return getattr(store, name)
