"""A disk cache of LLM replies keyed by the exact request, so an evaluation re-runs for free.

:class:`CachedLLM` wraps any :class:`~pgr_core.models.llm.LLM`. The key is a SHA-256 of the model name, the
messages, the schema, ``max_tokens`` and ``temperature``: change one character of a prompt and the
request is new. A hit returns the stored completion with the usage and seconds the original call
reported, so cost figures (LLM calls, tokens, LLM seconds) are the same on a re-run as on the first
run. Failures (timeouts, refused connections, HTTP errors) are never cached: a re-run asks again.

Entries are one JSON file each under ``<root>/<first two hex digits>/<key>.json``, written atomically
(temporary file + rename), so two processes may share a cache and a killed run leaves no torn entry.

:class:`DiskCachedEmbedder` does the same for vectors: ``<root>/vectors.sqlite3`` maps (embedder identity,
SHA-256 of the text) to the vector, so a re-run embeds neither the store nor the questions again.
:func:`disk_cached_embedder` puts the in-memory :class:`~pgr_core.models.caches.CachedEmbedder` on top of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import tempfile
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pgr_core.errors import InvalidArgumentError
from pgr_core.models.caches import CachedEmbedder
from pgr_core.models.embedders import Embedder
from pgr_core.models.llm import LLM, CallFlow, Completion, Message, Request, Usage, WrappedLLM

__all__ = [
    "CacheStats",
    "CachedLLM",
    "DiskCachedEmbedder",
    "disk_cached_embedder",
    "embedder_identity",
    "request_key",
]


def request_key(
    model: str, messages: Sequence[Message], schema: Mapping[str, Any] | None, max_tokens: int, temperature: float
) -> str:
    """The cache key of one request: stable across processes and Python versions."""
    payload = {
        "model": model,
        "messages": [dict(m) for m in messages],
        "schema": schema,
        "max_tokens": max_tokens,
        "temperature": temperature,
    }
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    saved_seconds: float = 0.0  # what the hits took when they were first asked


class CachedLLM(WrappedLLM):
    """``llm`` with a disk cache under ``root``. ``model`` names the model in the key (default: the
    wrapped LLM's ``model`` attribute, else its ``name``); ``stats`` counts hits and misses."""

    def __init__(self, llm: LLM, root: str | Path, *, model: str | None = None) -> None:
        super().__init__(llm, name=f"cached:{llm.name}")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.model = model or self.model
        self.stats = CacheStats()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CachedLLM({self.llm!r}, root={str(self.root)!r})"

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def lookup(self, key: str) -> Completion | None:
        path = self._path(key)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            usage = data.get("usage", {})
            return Completion(
                text=data["text"],
                usage=Usage(
                    int(usage.get("prompt_tokens", 0)),
                    int(usage.get("completion_tokens", 0)),
                    estimated=bool(usage.get("estimated", False)),
                ),
                model=data.get("model", ""),
                seconds=float(data.get("seconds", 0.0)),
                truncated=bool(data.get("truncated", False)),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None  # absent or unreadable: ask the model again

    def store(self, key: str, completion: Completion) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "text": completion.text,
            "usage": {
                "prompt_tokens": completion.usage.prompt_tokens,
                "completion_tokens": completion.usage.completion_tokens,
                "estimated": completion.usage.estimated,
            },
            "model": completion.model,
            "seconds": completion.seconds,
            "truncated": completion.truncated,
        }
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, ensure_ascii=False)
        os.replace(tmp, path)

    def _hit(self, key: str) -> Completion | None:
        found = self.lookup(key)
        with self._lock:
            if found is None:
                self.stats.misses += 1
            else:
                self.stats.hits += 1
                self.stats.saved_seconds += found.seconds
        return found

    def _call(self, request: Request) -> CallFlow:
        """A stored reply when there is one, else the model's, stored (a failure is raised, never stored)."""
        key = request_key(self.model, request.messages, request.schema, request.max_tokens, request.temperature)
        found = self._hit(key)
        if found is not None:
            return found
        completion = yield request
        self.store(key, completion)
        return completion


# ====================================================================== vectors

VECTOR_FILE = "vectors.sqlite3"
_CHUNK = 500  # keys per SELECT: below SQLite's oldest limit on bound parameters (999)


def embedder_identity(embedder: Any) -> str:
    """What a cached vector is keyed on besides its text: the embedder's name, its ``model`` (when it
    has one that its name does not already say) and its dimension. An embedder whose vectors change
    must change one of them."""
    name = str(getattr(embedder, "name", None) or type(embedder).__name__)
    model = getattr(embedder, "model", None)
    dim = int(getattr(embedder, "dim", 0) or 0)
    return f"{name}|{model}|{dim}" if model and str(model) != name else f"{name}|{dim}"


def _text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _busy(exc: sqlite3.Error) -> bool:
    """Another process holds the file (not a damaged file: it must not be set aside)."""
    return isinstance(exc, sqlite3.OperationalError) and any(w in str(exc) for w in ("locked", "busy"))


class DiskCachedEmbedder:
    """``inner`` with its vectors kept in ``<root>/vectors.sqlite3``, keyed by
    :func:`embedder_identity` and the SHA-256 of the text; a cached row is the row ``inner`` returned.

    Never fatal: a file that is not a readable vector cache is set aside (renamed ``.corrupt``) and a new
    one started, with a warning; when that fails too, or a read or write fails later, the cache is
    switched off with a warning and every text goes to ``inner``. ``hits`` and ``misses`` count texts.
    """

    def __init__(self, inner: Embedder, root: str | Path) -> None:
        dim = getattr(inner, "dim", 0)
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
            raise InvalidArgumentError(f"a disk vector cache needs an embedder with a dim > 0, got {dim!r}")
        self.inner = inner
        self.name: str = str(getattr(inner, "name", type(inner).__name__))
        self.dim: int = dim
        self.identity = embedder_identity(inner)
        self.path = Path(root) / VECTOR_FILE
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._db = self._open()

    def __repr__(self) -> str:
        return f"DiskCachedEmbedder({self.inner!r}, path={str(self.path)!r})"

    @property
    def active(self) -> bool:
        """False once the cache is off (unusable file or a failed read or write)."""
        return self._db is not None

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False)  # our lock serialises use
        try:
            # WAL + NORMAL: a commit per embed call stays cheap; losing the last ones in a crash costs a re-embed
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS vectors (embedder TEXT NOT NULL, key TEXT NOT NULL, "
                "vector BLOB NOT NULL, PRIMARY KEY (embedder, key)) WITHOUT ROWID"
            )
            db.execute("SELECT embedder, key, vector FROM vectors LIMIT 1").fetchall()  # the columns we use
        except BaseException:
            db.close()
            raise
        return db

    def _open(self) -> sqlite3.Connection | None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return self._connect()
        except OSError as exc:
            self._warn(f"cannot use the vector cache {self.path} ({exc}); embedding without it")
            return None
        except sqlite3.Error as exc:
            if _busy(exc):
                self._warn(f"the vector cache {self.path} stayed locked by another process; embedding without it")
                return None
            failure = exc
        aside = self.path.with_name(self.path.name + ".corrupt")
        try:
            os.replace(self.path, aside)
            for suffix in ("-wal", "-shm"):  # the damaged file's journal belongs to it, not to the new one
                extra = self.path.with_name(self.path.name + suffix)
                if extra.exists():
                    os.replace(extra, aside.with_name(aside.name + suffix))
            db = self._connect()
        except (OSError, sqlite3.Error) as exc:
            self._warn(
                f"the vector cache {self.path} is unreadable ({failure}) and cannot be replaced ({exc}); "
                "embedding without it"
            )
            return None
        self._warn(f"the vector cache {self.path} was unreadable ({failure}); set aside as {aside}, starting anew")
        return db

    def _warn(self, message: str) -> None:
        warnings.warn(message, RuntimeWarning, stacklevel=3)

    def _off(self, exc: sqlite3.Error) -> None:
        """Switch the cache off after a failed read or write (called with the lock held)."""
        self._warn(f"the vector cache {self.path} failed ({exc}); embedding without it from now on")
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass  # closing a broken connection: nothing more to lose
        self._db = None

    def _lookup(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        with self._lock:
            if self._db is None:
                return found
            try:
                for start in range(0, len(keys), _CHUNK):
                    part = keys[start : start + _CHUNK]
                    marks = ",".join("?" * len(part))
                    rows = self._db.execute(
                        f"SELECT key, vector FROM vectors WHERE embedder = ? AND key IN ({marks})",
                        (self.identity, *part),
                    ).fetchall()
                    for key, blob in rows:
                        if isinstance(blob, bytes) and len(blob) == 4 * self.dim:  # else a torn row: re-embed
                            found[key] = np.frombuffer(blob, dtype="<f4").astype(np.float32)
            except sqlite3.Error as exc:
                self._off(exc)
                return {}
        return found

    def _keep(self, fresh: Mapping[str, np.ndarray]) -> None:
        with self._lock:
            if self._db is None:
                return
            try:
                with self._db:  # one transaction
                    self._db.executemany(
                        "INSERT OR REPLACE INTO vectors (embedder, key, vector) VALUES (?, ?, ?)",
                        [(self.identity, k, np.asarray(v, dtype="<f4").tobytes()) for k, v in fresh.items()],
                    )
            except sqlite3.Error as exc:
                self._off(exc)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        keys = [_text_key(t) for t in texts]
        unique = dict(zip(keys, texts, strict=True))
        known = self._lookup(list(unique))
        hits = sum(1 for k in keys if k in known)
        missing = [k for k in unique if k not in known]
        if missing:
            rows = np.asarray(self.inner.embed([unique[k] for k in missing]), dtype=np.float32)
            if rows.shape != (len(missing), self.dim):
                raise ValueError(f"{self.inner!r} returned shape {rows.shape} for {len(missing)} texts")
            fresh = dict(zip(missing, rows, strict=True))
            self._keep(fresh)
            known.update(fresh)
        with self._lock:
            self.hits += hits
            self.misses += len(missing)
        return np.stack([known[k] for k in keys]).astype(np.float32, copy=False)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


def disk_cached_embedder(embedder: Embedder, root: str | Path) -> CachedEmbedder:
    """``embedder`` with the disk cache under ``root`` below its in-memory cache: an embedder that
    already caches in memory (MiniLM) keeps its cache size, with the disk cache between it and its model."""
    if isinstance(embedder, CachedEmbedder):
        return CachedEmbedder(DiskCachedEmbedder(embedder.inner, root), max_entries=embedder.max_entries)
    return CachedEmbedder(DiskCachedEmbedder(embedder, root))
