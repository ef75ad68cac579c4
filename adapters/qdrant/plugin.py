"""The ``qdrant`` plugin: registers the ``qdrant`` store factory. Imports only pgr_core.

registry = pgr_core.plugins.registry.load()
store = registry.store("qdrant", url="http://localhost:6333", collection="memories")
"""

from __future__ import annotations

from typing import Any

from pgr_core.errors import ConfigurationError
from pgr_core.plugins.hookspecs import Register, hookimpl

REQUIRES = ("qdrant_client",)
EXTRA = "qdrant"


def make_store(
    collection: str,
    *,
    location: str | None = None,
    url: str | None = None,
    path: str | None = None,
    api_key: str | None = None,
    client: Any = None,
    client_options: dict[str, Any] | None = None,
    embedder: Any = None,
    create: bool = False,
    **options: Any,
) -> Any:
    """A :class:`~pgr_adapters.qdrant.QdrantStore` over ``collection``.

    The client comes from ``client=`` or from exactly one of ``location=`` (e.g. ``":memory:"``),
    ``url=`` and ``path=`` (``api_key`` and ``client_options``, e.g. ``{"timeout": 5}``, go to the
    ``QdrantClient``). ``embedder`` is an Embedder, a registered embedder name ("minilm",
    "hashing"), or None for the default. ``create=True`` creates the collection when it is missing.
    Other options (``text_key``, ``vector_name``, ``scope_fields``, ``session_key``, ``position_key``,
    ``date_keys``, ``window``) go to ``QdrantStore``.
    """
    try:
        from qdrant_client import QdrantClient

        from .store import QdrantStore
    except ImportError as exc:
        raise ConfigurationError("the qdrant store needs qdrant-client: pip install 'pgr[qdrant]'") from exc
    if client is None:
        given: dict[str, Any] = {
            k: v for k, v in (("location", location), ("url", url), ("path", path)) if v is not None
        }
        if len(given) != 1:
            raise ConfigurationError(
                "the qdrant store needs exactly one of location=':memory:', url='http://...' or path='dir' "
                f"(or client=...), got {sorted(given) or 'none'}"
            )
        client = QdrantClient(**given, api_key=api_key, **(client_options or {}))
    embedder = _embedder(embedder)
    if create:
        exists = client.collection_exists(collection)
        if not exists:
            return QdrantStore.create_collection(client, collection, embedder.dim, embedder=embedder, **options)
    return QdrantStore(client, collection, embedder=embedder, **options)


def _embedder(embedder: Any) -> Any:
    if embedder is None:
        from pgr_core.models.embedders import default_embedder

        return default_embedder()
    if isinstance(embedder, str):
        from pgr_core.plugins import registry as plugins

        return plugins.load(entry_points=False).embedder(embedder)
    return embedder


@hookimpl
def register_stores(register: Register) -> None:
    register("qdrant", make_store)
