"""mem0 records <-> pgr facts: a vector-store point or a ``search()`` item becomes a :class:`Mem0Fact`,
a graph relation becomes a relation fact, and a pgr fact becomes the arguments of ``Memory.add``.

Imports no mem0: these are plain dicts and duck-typed points.

Owners: a record's ``user_id`` / ``agent_id`` / ``run_id`` are read only as plain strings
(:func:`owner_of`); a record naming its owner any other way (a list, which Qdrant's keyword filter
matches by any element; a number) is nobody's, and the store drops it from a search. Dates: mem0's
``created_at`` / ``updated_at`` without a timezone are read as UTC (:func:`parse_when`), so one memory
holding mem0's own aware stamps next to naive dates is still searched by date.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from pgr_core._dates import read_stored_date
from pgr_core.types import Fact, Scope, owner_fields

__all__ = [
    "RELATION_TYPE",
    "Mem0Fact",
    "fact_from_item",
    "fact_from_point",
    "owner_of",
    "relation_fact",
    "visible_to",
    "write_metadata",
]

SCOPE_KEYS = ("user_id", "agent_id", "run_id")
RELATION_TYPE = "relation"
# Payload keys mem0 lifts out of a point's payload into the top level of a search item; the rest of the
# payload is the item's ``metadata`` (mem0 2.x ``_search_vector_store``; 1.0.x lifts a subset).
_PROMOTED = ("user_id", "agent_id", "run_id", "actor_id", "role", "attributed_to", "expiration_date")
_CORE = {"data", "hash", "created_at", "updated_at", "id", "text_lemmatized", *_PROMOTED}
# What pgr writes into mem0 metadata to carry a Fact's own fields through a round trip.
_FACT_KEYS = ("type", "session_id", "position")


@dataclass(frozen=True)
class Mem0Fact(Fact):
    """A :class:`~pgr_core.Fact` that keeps the mem0 record it came from (``record``: mem0's item shape
    without the score: ``id``, ``memory``, ``hash``, ``metadata``, ``created_at``, ``updated_at``,
    ``user_id``, ... ; for a graph relation ``source``, ``relationship``, ``destination``)."""

    record: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_relation(self) -> bool:
        return self.type == RELATION_TYPE and bool(self.metadata.get("mem0_relation"))


def parse_when(value: Any) -> datetime | None:
    """mem0's ``created_at`` / ``updated_at`` (ISO strings, aware or naive) as aware datetimes: an aware
    one keeps its offset, a naive one is read as UTC; anything unreadable is None rather than a failed
    search."""
    return read_stored_date(value)


def expired(payload: Mapping[str, Any]) -> bool:
    """mem0 2.x hides a memory whose ``expiration_date`` (YYYY-MM-DD) is past; so does pgr."""
    value = payload.get("expiration_date")
    if not value:
        return False
    try:
        return date.fromisoformat(str(value)) < datetime.now(UTC).date()
    except ValueError:
        return False


def owner_of(source: Mapping[str, Any]) -> Scope | None:
    """The owner a record (a point's payload or a ``search`` item) names, each id a plain string (a blank
    one names nothing); None when it names none, or names one ambiguously (a list, a number...)."""
    ids = owner_fields(source, {key: key for key in SCOPE_KEYS})
    return Scope(**ids) if ids else None


def visible_to(source: Mapping[str, Any], scope: Scope) -> bool:
    """True when the record's owner is plainly one ``scope`` may see."""
    owner = owner_of(source)
    return owner is not None and scope.allows(owner)


def _fact(record: dict[str, Any], metadata: Mapping[str, Any], scope: Scope) -> Mem0Fact:
    position = metadata.get("position")
    session = metadata.get("session_id")
    kind = metadata.get("type", metadata.get("memory_type"))
    return Mem0Fact(
        id=str(record["id"]),
        text=str(record["memory"]),
        scope=scope,
        type=str(kind) if kind is not None else None,
        date=parse_when(record.get("created_at")),
        updated_at=parse_when(record.get("updated_at")),
        # a turn's place in its session, when pgr wrote it; both or neither, as Fact wants
        session_id=str(session) if session is not None and isinstance(position, int) else None,
        position=position if session is not None and isinstance(position, int) else None,
        metadata=dict(metadata),
        record=record,
    )


def fact_from_point(point: Any) -> Mem0Fact | None:
    """A vector-store hit (``.id``, ``.payload``) as mem0's ``search`` would format it; None for a point
    without text or without an owner (mem0 never writes one)."""
    payload = dict(getattr(point, "payload", None) or {})
    scope = owner_of(payload)
    if not payload.get("data") or scope is None:
        return None
    metadata = {k: v for k, v in payload.items() if k not in _CORE}
    record: dict[str, Any] = {
        "id": str(point.id),
        "memory": payload["data"],
        "hash": payload.get("hash"),
        "metadata": metadata or None,
        "created_at": payload.get("created_at"),
        "updated_at": payload.get("updated_at"),
    }
    record.update({k: payload[k] for k in _PROMOTED if k in payload})
    return _fact(record, metadata, scope)


def fact_from_item(item: Mapping[str, Any]) -> Mem0Fact | None:
    """An item of ``Memory.search(...)["results"]`` (its ``score`` is left out of the record)."""
    scope = owner_of(item)
    if not item.get("memory") or scope is None or item.get("id") is None:
        return None
    record = {k: v for k, v in item.items() if k not in ("score", "score_details")}
    return _fact(record, dict(item.get("metadata") or {}), scope)


def relation_text(source: str, relationship: str, destination: str) -> str:
    """The sentence a relation is embedded and shown as: mem0 stores names with underscores."""
    return " ".join(part.replace("_", " ").strip() for part in (source, relationship, destination))


def relation_fact(relation: Mapping[str, Any], scope: Scope) -> Mem0Fact | None:
    """A graph relation ``{"source", "relationship", "destination"}`` found under ``scope``.

    Its id hashes the triple and the scope it was searched under, so it is the same on every call."""
    source = relation.get("source")
    relationship = relation.get("relationship")
    destination = relation.get("destination", relation.get("target"))
    if not (source and relationship and destination):
        return None
    triple = (str(source), str(relationship), str(destination))
    key = "\x1f".join([*(f"{k}={v}" for k, v in sorted(scope.as_dict().items())), *triple])
    record = {"source": triple[0], "relationship": triple[1], "destination": triple[2]}
    return Mem0Fact(
        id="rel-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:24],
        text=relation_text(*triple),
        scope=scope,
        type=RELATION_TYPE,
        metadata={"mem0_relation": True, **record},
        record=record,
    )


def write_metadata(fact: Fact) -> dict[str, Any]:
    """The ``metadata=`` of ``Memory.add`` for ``fact``: its own metadata, its type and turn place, and its
    date as ``created_at`` (mem0 keeps a ``created_at`` it is given and stamps ``now`` otherwise)."""
    out = {k: v for k, v in fact.metadata.items() if k not in SCOPE_KEYS}
    for key in _FACT_KEYS:
        value = getattr(fact, key)
        if value is not None:
            out[key] = value
    if fact.date is not None:
        out["created_at"] = fact.date.isoformat()
    return out
