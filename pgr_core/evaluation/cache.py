"""A disk cache of LLM replies keyed by the exact request, so an evaluation re-runs for free.

:class:`CachedLLM` wraps any :class:`~pgr_core.llm.LLM`. The key is a SHA-256 of the model name, the
messages, the schema, ``max_tokens`` and ``temperature``: change one character of a prompt and the
request is new. A hit returns the stored completion with the usage and seconds the original call
reported, so cost figures (LLM calls, tokens, LLM seconds) are the same on a re-run as on the first
run. Failures (timeouts, refused connections, HTTP errors) are never cached: a re-run asks again.

Entries are one JSON file each under ``<root>/<first two hex digits>/<key>.json``, written atomically
(temporary file + rename), so two processes may share a cache and a killed run leaves no torn entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..llm import LLM, Completion, Message, Usage

__all__ = ["CacheStats", "CachedLLM", "request_key"]


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


class CachedLLM(LLM):
    """``llm`` with a disk cache under ``root``. ``model`` names the model in the key (default: the
    wrapped LLM's ``model`` attribute, else its ``name``); ``stats`` counts hits and misses."""

    def __init__(self, llm: LLM, root: str | Path, *, model: str | None = None) -> None:
        self.llm = llm
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.model = model or str(getattr(llm, "model", None) or llm.name)
        self.name = f"cached:{llm.name}"
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

    def complete(
        self,
        messages: Sequence[Message],
        *,
        schema: Mapping[str, Any] | None = None,
        max_tokens: int = 512,
        temperature: float = 0.0,
    ) -> Completion:
        key = request_key(self.model, messages, schema, max_tokens, temperature)
        found = self._hit(key)
        if found is not None:
            return found
        completion = self.llm.complete(messages, schema=schema, max_tokens=max_tokens, temperature=temperature)
        self.store(key, completion)
        return completion

    async def acomplete(
        self,
        messages: Sequence[Message],
        *,
        schema: Mapping[str, Any] | None = None,
        max_tokens: int = 512,
        temperature: float = 0.0,
    ) -> Completion:
        key = request_key(self.model, messages, schema, max_tokens, temperature)
        found = self._hit(key)
        if found is not None:
            return found
        completion = await self.llm.acomplete(messages, schema=schema, max_tokens=max_tokens, temperature=temperature)
        self.store(key, completion)
        return completion
