"""Replies a model wrote once, replayed without the model: :class:`RecordedLLM`.

A reply is keyed by exactly what was asked (the messages, the reply schema, max_tokens, temperature),
the key llm-relay files it under (``../shared/tools/llm-relay``: ``answers/<key>.json`` holding
``{"content": ...}``). So a folder of relay answers, or a JSON file ``{key: reply}``, replays a run
made against a capable model: the same prompts get the same replies, and a prompt that changed gets
none (an :class:`~pgr_core.errors.LLMError` naming the request, so the run degrades visibly rather
than answering from another prompt's reply).

``pgr demo`` without an LLM replays the replies recorded for its bundled history this way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pgr_core.errors import InvalidArgumentError, LLMError
from pgr_core.models.llm import LLM, Completion, Usage

__all__ = ["RecordedLLM", "request_key"]


def request_key(
    messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None, max_tokens: int, temperature: float
) -> str:
    """llm-relay's key of a request: a SHA-256 of what was asked, its first 32 hex digits."""
    payload = {
        "messages": [dict(m) for m in messages],
        "schema": dict(schema) if schema is not None else None,
        "max_tokens": max_tokens,
        "temperature": temperature,
    }
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


class RecordedLLM(LLM):
    """An LLM that answers only what it has a recorded reply for.

    >>> llm = RecordedLLM.from_path("lab/replies/capable")  # doctest: +SKIP

    ``replies``: ``{key: reply text}`` (see :func:`request_key`). ``name`` is the model the replies
    came from, shown in traces.
    """

    def __init__(self, replies: Mapping[str, str], *, name: str = "recorded") -> None:
        bad = [k for k, v in replies.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise InvalidArgumentError(f"recorded replies must map request keys to reply texts; bad entries: {bad[:3]}")
        self.replies = dict(replies)
        self.name = name

    @classmethod
    def from_path(cls, path: str | Path, *, name: str = "recorded") -> RecordedLLM:
        """From llm-relay's folder (its ``answers/``) or a JSON file ``{key: reply}``."""
        path = Path(path)
        if path.is_dir():
            folder = path / "answers" if (path / "answers").is_dir() else path
            replies = {p.stem: json.loads(p.read_text(encoding="utf-8"))["content"] for p in folder.glob("*.json")}
        elif path.is_file():
            replies = json.loads(path.read_text(encoding="utf-8"))
        else:
            raise InvalidArgumentError(f"no recorded replies at {path}: give llm-relay's folder or a JSON file")
        return cls(replies, name=name)

    def __repr__(self) -> str:
        return f"RecordedLLM({self.name!r}, {len(self.replies)} replies)"

    def complete(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        schema: Mapping[str, Any] | None = None,
        max_tokens: int = 512,
        temperature: float = 0.0,
    ) -> Completion:
        key = request_key(messages, schema, max_tokens, temperature)
        text = self.replies.get(key)
        if text is None:
            raise LLMError(f"{self.name}: no recorded reply for request {key} (its prompt differs from the recording)")
        # counted as llm-relay reports them (all the prompt's characters / 4), so a replay bills what the run did
        prompt_chars = sum(len(str(m.get("content", ""))) for m in messages)
        return Completion(text=text, usage=Usage(prompt_chars // 4, len(text) // 4), model=self.name)
