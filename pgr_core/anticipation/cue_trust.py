"""How far a user's cues can be trusted: do they point at their own fact?

A cue writer is asked about a whole session at once, so what it writes for one fact can read as
another's. On MQ-lite's short dated facts the local 1.5B model's cue sets mostly stay with their fact;
on LoCoMo's long chat turns they do not, and there summing the cue term into a fact's score costs
recall (lab/RESULTS.md). This module measures it per scope, with no LLM:

- a cue set is *aligned* when the mean of its cue vectors is closer to its own fact than to any other
  fact of the same session (the facts the writer saw beside it);
- picking a session's fact at random would align ``1/n`` of the time in a session of ``n`` facts, so
  the measure is chance-corrected: ``kappa = (aligned - chance) / (judged - chance)`` (0 when the cues
  tell their facts apart no better than chance, 1 when always);
- ``trust = clip(kappa / TRUST_FULL, 0, 1)``; the cue term of a fact's centred score in that scope is
  weighted ``max(TRUST_FLOOR, trust)`` (:attr:`Alignment.cue_weight`): a cue set filed
  under the wrong fact of its session still speaks of that session's subject, so at chance the cues
  keep a small weight rather than none. With fewer than :data:`MIN_JUDGED` cue sets in sessions of two
  or more facts there is too little to judge, and the cues count in full.
- a fact alone in its session had its cues written with no other fact beside it, so they cannot be
  another fact's: its cue term always counts in full (PrefEval's stated preference, alone in its
  session among long filler conversations whose turns' cues are mixed up).

Measured with the local model's cues (RESULTS.md): MQ-lite dev users kappa 0.42 to 0.47 (trust 1),
LoCoMo conv-30 kappa -0.003 (trust 0: the cue term weighted 0.2; 0.566 at recall@20 against 0.515
with it dropped and 0.492 plain), conv-26 kappa 0.030 (0.603 against 0.572 plain, 282 of 419 turns
cued), PrefEval's filler turns -0.06 to -0.02 (trust 0, the fillers' cue term weighted 0.2, the
preference, alone in its session, keeping its cues in full).

:class:`CueTrust` keeps one figure per scope, rebuilt after a write to the store or to the cue index
in that scope, reading at most :data:`MAX_SESSIONS` sessions (an even sample) of the scope's facts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from pgr_core.policy.centring import CentringUnavailable, PerScope, read_vectors
from pgr_core.types import SESSION_KEY, Fact, Scope, fact_key

if TYPE_CHECKING:
    from pgr_core.models.embedders import Embedder
    from pgr_core.stores.contract import Store

__all__ = [
    "MAX_SESSIONS",
    "MIN_JUDGED",
    "TRUST_FLOOR",
    "TRUST_FULL",
    "Alignment",
    "CueTrust",
    "alignment",
    "session_of",
]

logger = logging.getLogger("pgr")

TRUST_FULL = 0.2
"""Chance-corrected alignment at and above which a scope's cues count in full."""
TRUST_FLOOR = 0.2
"""The cue term's weight in a scope whose cues tell their facts apart no better than chance: a cue set
filed under the wrong fact of a session still speaks of that session's subject, so it is kept at a
small weight rather than dropped (LoCoMo conv-30, RESULTS.md: 0.515 at recall@20 with the cue term
dropped; 0.556 to 0.573 offline with it weighted 0.1 to 0.3, and 0.566 through ``pgr eval`` at 0.2)."""
MIN_JUDGED = 12
"""Fewer cue sets than this in sessions of two or more facts: too little to judge, the cues count in full."""
MAX_SESSIONS = 300
"""Sessions of two or more facts read per scope (an even sample of them beyond this)."""


def session_of(fact: Fact) -> str:
    """The session a fact was written in (extracted facts carry it in their metadata), or ''."""
    marker = fact.metadata.get(SESSION_KEY) if isinstance(fact.metadata, Mapping) else None
    return str(fact.session_id or marker or "")


@dataclass(frozen=True)
class Alignment:
    """One scope's cue sets judged against the other facts of their sessions."""

    judged: int = 0  # cue sets of facts in sessions of two or more facts
    aligned: int = 0  # of those, closer to their own fact than to any other of the session
    chance: float = 0.0  # how many a random pick among each session's facts would align (sum of 1/n)
    # facts alone in their session, whose cue term counts in full whatever the trust (kept below trust 1)
    lone: frozenset[str] = field(default=frozenset(), repr=False)

    @property
    def kappa(self) -> float:
        """Chance-corrected alignment: 0 no better than chance, 1 always aligned (1.0 when nothing judged)."""
        if self.judged <= self.chance:
            return 1.0
        return (self.aligned - self.chance) / (self.judged - self.chance)

    @cached_property
    def trust(self) -> float:  # read once per fact a search scores (weight): computed once
        """The weight of the cue term: 1 with too little to judge, else ``clip(kappa / TRUST_FULL, 0, 1)``."""
        if self.judged < MIN_JUDGED:
            return 1.0
        return float(min(max(self.kappa / TRUST_FULL, 0.0), 1.0))

    @cached_property
    def cue_weight(self) -> float:
        """The weight of the cue term of a fact that shares its session: :attr:`trust`, never below
        :data:`TRUST_FLOOR`."""
        return max(TRUST_FLOOR, self.trust)

    def weight(self, key: str) -> float:
        """The weight of one fact's cue term (by :attr:`Fact.key`): in full for a fact alone in its
        session, else :attr:`cue_weight`."""
        return 1.0 if key in self.lone else self.cue_weight

    def to_dict(self) -> dict[str, Any]:
        return {
            "judged": self.judged,
            "aligned": self.aligned,
            "chance": round(self.chance, 2),
            "kappa": round(self.kappa, 3),
            "trust": round(self.trust, 3),
            "cue_weight": round(self.cue_weight, 3),
            "lone_facts": len(self.lone),
        }


def alignment(
    fact_vectors: np.ndarray, sessions: Sequence[Sequence[int]], cue_vectors: Mapping[int, np.ndarray]
) -> Alignment:
    """Judge cue sets: ``fact_vectors`` (unit rows), ``sessions`` (row indices of each session's facts),
    ``cue_vectors`` (row index -> that fact's cue vectors, unit rows; a fact without cues is absent).

    >>> facts = np.eye(3)
    >>> a = alignment(facts, [[0, 1, 2]], {0: np.array([[1.0, 0, 0]]), 1: np.array([[1.0, 0.1, 0]])})
    >>> (a.judged, a.aligned, round(a.chance, 2))
    (2, 1, 0.67)
    """
    judged = aligned = 0
    chance = 0.0
    for members in sessions:
        if len(members) < 2:
            continue
        rows = fact_vectors[list(members)]
        for at, row in enumerate(members):
            vectors = cue_vectors.get(row)
            if vectors is None or not len(vectors):
                continue
            centroid = np.asarray(vectors).mean(axis=0)
            judged += 1
            aligned += int(np.argmax(rows @ centroid)) == at
            chance += 1.0 / len(members)
    return Alignment(judged, aligned, chance)


class CueTrust:
    """Per scope, the :class:`Alignment` of its cue sets (and so the weight of its cue term).

    ``cue_records(fact_ids, scope)`` gives the cue records of those facts (their ``metadata["fact_id"]``
    names the fact). Thread-safe; a scope's figure is dropped when the store or the cue index reports a
    write there. At most ``max_scopes`` are kept, least recently used first out.
    """

    def __init__(
        self,
        store: Store,
        cues: Store,
        embedder: Embedder | None,
        cue_records: Callable[[Sequence[str], Scope], list[Fact]],
        *,
        max_scopes: int = 256,
    ) -> None:
        self.store = store
        self.cues = cues
        self.embedder = embedder
        self.cue_records = cue_records
        self._held: PerScope[Alignment] = PerScope(max_scopes)
        store.add_listener(self.invalidate)  # held weakly
        cues.add_listener(self.invalidate)

    def invalidate(self, scopes: Collection[Scope] | None = None) -> None:
        """Store listener: forget every scope that can see a fact owned by ``scopes``. Never raises."""
        self._held.invalidate(scopes)

    def alignment(self, scope: Scope) -> Alignment:
        """``scope``'s cue sets judged; nothing judged (1.0 trust) where the vectors cannot be read."""
        try:
            return self._held.get(scope, self._judged)
        except Exception as exc:  # a store that fails a read here fails the search on its own; never this
            logger.warning("cue trust for %s not judged (the cues count in full): %s", scope, exc)
            return Alignment()  # not kept: judged again next time

    def _judged(self, scope: Scope) -> Alignment:
        try:
            return self._judge(scope)
        except CentringUnavailable as exc:
            logger.debug("cue trust for %s not judged: %s", scope, exc)
            return Alignment()

    def _judge(self, scope: Scope) -> Alignment:
        if not self.store.capabilities.lists:
            raise CentringUnavailable(
                f"{type(self.store).__name__} cannot list a scope's facts (no capabilities.lists: facts_for)"
            )
        by_session: dict[tuple[Scope, str], list[Fact]] = {}
        for fact in self.store.facts_for(scope):  # type: ignore[attr-defined]
            session = session_of(fact)
            if session:  # a fact with no session has no neighbours to be told apart from
                by_session.setdefault((fact.scope, session), []).append(fact)
        groups = [g for g in by_session.values() if len(g) > 1]
        lone = frozenset(g[0].key for g in by_session.values() if len(g) == 1)
        if len(groups) > MAX_SESSIONS:
            step = len(groups) / MAX_SESSIONS
            groups = [groups[int(i * step)] for i in range(MAX_SESSIONS)]
        facts = [f for g in groups for f in g]
        if not facts:
            return Alignment()
        owned: dict[Scope, list[str]] = {}
        for f in facts:
            owned.setdefault(f.scope, []).append(f.id)
        records = [r for owner, ids in owned.items() for r in self.cue_records(ids, owner)]
        if not records:
            return Alignment()
        row_of = {f.key: i for i, f in enumerate(facts)}
        fact_vectors = read_vectors(self.store, self.embedder, scope, facts)
        record_vectors = read_vectors(self.cues, self.embedder, scope, records)
        cue_vectors: dict[int, list[np.ndarray]] = {}
        for record, vector in zip(records, record_vectors, strict=True):
            row = row_of.get(fact_key(str(record.metadata.get("fact_id") or ""), record.scope))
            if row is not None:
                cue_vectors.setdefault(row, []).append(vector)
        sessions, at = [], 0
        for g in groups:
            sessions.append(list(range(at, at + len(g))))
            at += len(g)
        found = alignment(fact_vectors, sessions, {row: np.stack(v) for row, v in cue_vectors.items()})
        return replace(found, lone=lone) if found.trust < 1.0 else found  # only a partial trust needs them
