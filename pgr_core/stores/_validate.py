"""What every store checks at the write, so a bad fact is refused before anything is stored.

A fact that would fail later (at ``save()``, at a checkpoint, in a windowed search) is refused here
with an :class:`~pgr_core.errors.InvalidArgumentError` naming the field: text that is not encodable
UTF-8 (a lone surrogate), metadata that is not JSON, a position that is not an integer, a date that is
not a ``datetime``. :func:`check_vectors` refuses NaN, infinite or zero vectors.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np

from pgr_core.errors import InvalidArgumentError
from pgr_core.types import Fact, Scope

__all__ = [
    "MAX_METADATA_DEPTH",
    "MAX_POSITION",
    "MAX_TEXT_CHARS",
    "check_date_kind",
    "check_fact",
    "check_facts",
    "check_id",
    "check_ids",
    "check_vectors",
]

MAX_TEXT_CHARS = 100_000  # one fact; anything longer is a document, not a memory
MAX_POSITION = 2**63 - 1  # a turn's position is a signed 64-bit payload integer in Qdrant's engine
MAX_METADATA_DEPTH = 32  # nesting of lists and objects in a fact's metadata (JSON readers recurse)


def _depth(value: Any, limit: int) -> bool:
    """Whether ``value``'s lists and mappings nest deeper than ``limit`` (without recursing)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _utf8(value: str, what: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"{what} is not valid UTF-8 text (character {exc.start}: {value[exc.start : exc.end]!r}, a lone "
            "surrogate?); clean the text before storing it"
        ) from None


def check_fact(fact: object, index: int = 0) -> Fact:
    if not isinstance(fact, Fact):
        raise InvalidArgumentError(f"item {index} is a {type(fact).__name__}, not a Fact")
    if not isinstance(fact.id, str) or not fact.id or not fact.id.strip():
        raise InvalidArgumentError(f"fact {index} needs a non-empty string id, got {fact.id!r}")
    _utf8(fact.id, f"fact {index}'s id")
    name = f"fact {fact.id!r}"
    if not isinstance(fact.scope, Scope):
        raise InvalidArgumentError(f"{name}: scope must be a Scope, got {type(fact.scope).__name__}")
    if not isinstance(fact.text, str) or not fact.text.strip():
        raise InvalidArgumentError(f"{name}: text must be a non-empty string, got {fact.text!r:.60}")
    if len(fact.text) > MAX_TEXT_CHARS:
        raise InvalidArgumentError(f"{name}: text is {len(fact.text)} characters, over {MAX_TEXT_CHARS}; split it")
    _utf8(fact.text, f"{name}'s text")
    for field in ("type", "session_id"):
        value = getattr(fact, field)
        if value is not None:
            if not isinstance(value, str):
                raise InvalidArgumentError(f"{name}: {field} must be a string or None, got {type(value).__name__}")
            _utf8(value, f"{name}'s {field}")
    for field in ("date", "updated_at"):
        value = getattr(fact, field)
        if value is not None and not isinstance(value, datetime):
            raise InvalidArgumentError(
                f"{name}: {field} must be a datetime or None, got {type(value).__name__} {value!r:.40} "
                "(parse it first: pgr_core._dates.parse_date, or pass date= to add())"
            )
    pos = fact.position
    if pos is not None and (isinstance(pos, bool) or not isinstance(pos, int) or not 0 <= pos <= MAX_POSITION):
        raise InvalidArgumentError(f"{name}: position must be an integer in [0, 2**63 - 1] or None, got {pos!r:.40}")
    if (fact.session_id is None) != (pos is None):
        raise InvalidArgumentError(f"{name}: give both session_id and position, or neither")
    if not isinstance(fact.metadata, Mapping):
        raise InvalidArgumentError(f"{name}: metadata must be a mapping (a dict), got {type(fact.metadata).__name__}")
    if _depth(fact.metadata, MAX_METADATA_DEPTH):
        raise InvalidArgumentError(f"{name}: metadata nests deeper than {MAX_METADATA_DEPTH} levels; flatten it")
    try:
        json.dumps(dict(fact.metadata), ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError) as exc:
        raise InvalidArgumentError(f"{name}: metadata must be JSON (strings, numbers, lists, objects): {exc}") from None
    return fact


def check_facts(facts: Sequence[Any]) -> list[Fact]:
    """Every fact checked before any is stored; a duplicate id within one batch is refused."""
    out = [check_fact(f, i) for i, f in enumerate(facts)]
    seen: dict[str, Scope] = {}
    for f in out:
        other = seen.get(f.id)
        if other is not None and other != f.scope:
            raise InvalidArgumentError(f"fact id {f.id!r} appears twice in one batch with different owners")
        seen[f.id] = f.scope
    return out


def check_id(fact_id: object) -> str:
    """A fact id as a read or delete takes it: a non-empty string."""
    if not isinstance(fact_id, str) or not fact_id:
        raise InvalidArgumentError(f"a fact id must be a non-empty string, got {fact_id!r:.60}")
    return fact_id


def check_ids(fact_ids: object) -> list[str]:
    """Fact ids as a delete takes them: a list (or other iterable) of ids, each once, in order. A lone
    string is refused: iterated, it would be its characters."""
    if isinstance(fact_ids, str | bytes) or not isinstance(fact_ids, Iterable):
        name = type(fact_ids).__name__
        raise InvalidArgumentError(f"fact ids must be a list of ids, got a {name}: pass [{fact_ids!r:.40}]")
    return list(dict.fromkeys(check_id(i) for i in fact_ids))


def check_date_kind(
    batch: Sequence[Fact], aware: bool | None, stored: Callable[[], bool | None] | None = None
) -> bool | None:
    """All dates timezone-aware, or all naive: ``aware`` is the kind a store holds (None: not known;
    ``stored()``, when given, reads it from the store once, at the first dated fact). Returns the kind
    after ``batch``; a fact of the other kind is an InvalidArgumentError."""
    for fact in batch:
        for moment in (fact.date, fact.updated_at):
            if moment is None:
                continue
            kind = moment.tzinfo is not None and moment.utcoffset() is not None
            if aware is None:
                aware = stored() if stored is not None else None
                aware = kind if aware is None else aware
            if kind != aware:
                raise InvalidArgumentError(
                    f"fact {fact.id!r} has a {'timezone-aware' if kind else 'naive'} date but this "
                    f"store holds {'aware' if aware else 'naive'} ones; use one kind for all dates"
                )
    return aware


def check_vectors(vectors: Any, rows: int, dim: int) -> np.ndarray:
    """``vectors`` as a float32 (rows, dim) array of finite, non-zero rows."""
    try:
        arr = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"vectors must be numbers, (rows, dim) floats: {exc}") from None
    if arr.shape != (rows, dim):
        raise InvalidArgumentError(f"vectors must have shape ({rows}, {dim}), got {arr.shape}")
    if rows and not np.isfinite(arr).all():
        bad = int(np.nonzero(~np.isfinite(arr).all(axis=1))[0][0])
        raise InvalidArgumentError(f"vector {bad} holds NaN or infinite values; re-embed that fact")
    if rows:
        norms = np.linalg.norm(arr, axis=1)
        if (norms == 0).any() or not all(math.isfinite(float(n)) for n in norms):
            raise InvalidArgumentError(f"vector {int(np.argmin(norms))} is all zeros; re-embed that fact")
    return arr
