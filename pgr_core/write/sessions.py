"""Conversation sessions, the input of the write side, and loaders that read them from data sets.

A :class:`Session` is one dated conversation: an id, a date and its turns. Loaders read them from
where they lie (nothing is copied): :func:`locomo_sessions` (LoCoMo, one user per conversation) and
:func:`jsonl_sessions` (one user per line, the format of ``docs/eval-format.md``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pgr_core._dates import DateLike, parse_date
from pgr_core.datasets import json_objects, read_locomo
from pgr_core.errors import InvalidArgumentError
from pgr_core.types import Scope

__all__ = [
    "Session",
    "Turn",
    "UserSessions",
    "jsonl_sessions",
    "key_part",
    "legacy_scope_label",
    "locomo_sessions",
    "scope_label",
]

ASSISTANT_ROLES = frozenset({"assistant", "system", "tool"})


@dataclass(frozen=True)
class Turn:
    """One utterance. ``id`` is the data set's own turn id when it has one (LoCoMo's ``D1:3``)."""

    speaker: str
    text: str
    id: str | None = None

    @property
    def line(self) -> str:
        return f"{self.speaker}: {self.text}"


@dataclass(frozen=True)
class Session:
    """One dated conversation.

    >>> s = Session("s1", "2025-03-02", [Turn("user", "My physio says no sudden stops until July.")])
    >>> s.date.year
    2025
    """

    id: str
    date: datetime | None
    turns: tuple[Turn, ...]

    def __init__(self, id: str, date: DateLike | None, turns: Sequence[Turn | Mapping[str, Any]]) -> None:
        if not isinstance(id, str) or not id.strip():
            raise InvalidArgumentError(f"a session needs a non-empty string id, got {id!r}")
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "date", parse_date(date, what=f"session {id} date"))
        object.__setattr__(self, "turns", tuple(_turn(t, id, i) for i, t in enumerate(turns)))

    @property
    def content_hash(self) -> str:
        """A hash of the date and every turn: the ledger's test for "already ingested, unchanged"."""
        payload = json.dumps(
            [self.date.isoformat() if self.date else None, [[t.speaker, t.text, t.id] for t in self.turns]],
            ensure_ascii=False,
        )
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:32]

    def transcript(self, limit: int = 12000) -> str:
        """The turns as ``speaker: text`` lines, cut to ``limit`` characters (the end is kept)."""
        text = "\n".join(t.line for t in self.turns)
        return text if len(text) <= limit else "[... earlier turns cut ...]\n" + text[-limit:]


def _turn(value: Turn | Mapping[str, Any], session: str, i: int) -> Turn:
    if isinstance(value, Turn):
        return value
    if isinstance(value, Mapping):
        text = value.get("text", value.get("content"))
        if not isinstance(text, str):
            raise InvalidArgumentError(f"session {session} turn {i}: needs a 'text' string")
        speaker = value.get("speaker") or value.get("role") or "user"
        return Turn(str(speaker), text, value.get("id"))
    raise InvalidArgumentError(f"session {session} turn {i}: a Turn or a mapping, not {type(value).__name__}")


_KEY_ESCAPES = {"%": "%25", "/": "%2F", ":": "%3A", "=": "%3D"}


def key_part(value: str) -> str:
    """``value`` with the characters that join id parts escaped (``%``, ``/``, ``:``, ``=``), so parts
    joined by them split back one way only; a plain name (``u1``, ``conv-26``, ``S3``) is unchanged."""
    return "".join(_KEY_ESCAPES.get(ch, ch) for ch in value)


def scope_label(scope: Scope) -> str:
    """A readable, unambiguous prefix for fact ids of ``scope``: ``u1`` for a user, ``u1/a=bot`` or
    ``u1/a=bot/r=r9`` when more is set, ``a=bot`` for an agent alone.

    Each part is escaped (:func:`key_part`), so ``Scope(user_id="u1/x")`` (``u1%2Fx``) and
    ``Scope(user_id="u1", agent_id="x")`` (``u1/a=x``) never share a label, and a label never holds
    the ``:`` that separates it from the rest of an id.

    >>> scope_label(Scope(user_id="u1", agent_id="x")), scope_label(Scope(user_id="u1/x"))
    ('u1/a=x', 'u1%2Fx')
    """
    parts = [key_part(scope.user_id)] if scope.user_id else []
    parts += [f"{tag}={key_part(v)}" for tag, v in (("a", scope.agent_id), ("r", scope.run_id)) if v]
    return "/".join(parts)


def legacy_scope_label(scope: Scope) -> str:
    """The label ledgers written before labels were escaped used (``u1/agent/run``, ambiguous): kept
    only to read those ledgers."""
    return "/".join(v for v in (scope.user_id, scope.agent_id, scope.run_id) if v)


@dataclass
class UserSessions:
    """One user's sessions (a LoCoMo conversation, a JSONL line)."""

    scope: Scope
    sessions: list[Session] = field(default_factory=list)


# --------------------------------------------------------------------------- LoCoMo


def locomo_sessions(path: str | Path, *, users: Sequence[str] | None = None) -> Iterator[UserSessions]:
    """LoCoMo's conversations as sessions: ``Scope(user_id=<sample id>)``, session ids ``S1``, ``S2``...

    Read by :func:`pgr_core.datasets.read_locomo`, the parser the evaluation uses too, so the dates,
    texts and turn ids here are the evaluation's (a session without a date time is undated). Turn ids
    are LoCoMo's ``dia_id`` (``D1:3``), so raw ingestion gives each turn the fact id ``<sample>:D1:3``
    that the evaluation's gold evidence names; a shared image's caption is in the turn text.
    """
    wanted = set(users) if users else None
    for conv in read_locomo(path):
        if wanted is not None and conv.sample_id not in wanted:
            continue
        sessions = [
            Session(f"S{s.number}", s.date, [Turn(t.speaker, t.text, t.id) for t in s.turns]) for s in conv.sessions
        ]
        yield UserSessions(Scope(user_id=conv.sample_id), sessions)


# --------------------------------------------------------------------------- JSONL (docs/eval-format.md)


def jsonl_sessions(path: str | Path, *, users: Sequence[str] | None = None) -> Iterator[UserSessions]:
    """One user per line: ``{"user_id", "sessions": [{"id", "date", "turns": [{speaker|role, text}]}]}``.

    Lines without ``sessions`` are skipped (a line may carry only facts). Errors name the line.
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidArgumentError(f"no sessions file at {path}")
    wanted = set(users) if users else None
    with path.open(encoding="utf-8") as fh:
        for n, record in json_objects(fh, str(path)):
            if "user_id" not in record:
                raise InvalidArgumentError(f"{path} line {n}: expected an object with a 'user_id'")
            user = str(record["user_id"])
            if wanted is not None and user not in wanted:
                continue
            sessions = []
            for j, s in enumerate(record.get("sessions") or []):
                if not isinstance(s, dict) or "id" not in s:
                    raise InvalidArgumentError(f"{path} line {n} session {j}: needs an 'id'")
                try:
                    sessions.append(Session(str(s["id"]), s.get("date"), s.get("turns") or []))
                except InvalidArgumentError as exc:
                    raise InvalidArgumentError(f"{path} line {n}: {exc}") from None
            if sessions:
                yield UserSessions(Scope(user_id=user), sessions)
