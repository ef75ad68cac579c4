"""Anticipating: a store whose facts are also found through their cues.

``Anticipating(store)`` is a :class:`~pgr_core.stores.contract.Store` around any pgr store. Beside the user's
facts it keeps a *cue index*: for each fact, the few requests in which it would matter
(:mod:`pgr_core.anticipation.cues`), embedded, keyed by the fact's owner and id. A round's probes go to the store
and to the cue index, one batch call each; a fact scores the larger of its own similarity and
``cue_weight`` × its best cue's, so an under-specified request meets the knee surgery through "should
I join a soccer league this summer?" with no LLM call in the query path.

- The user's store is never written by the index: cues live in a pgr-owned embedded store (an
  :class:`~pgr_core.stores.memory.InMemoryStore`, or an :class:`~pgr_core.stores.edge.EdgeStore` directory; by
  default ``<DIR>/cues`` inside an EdgeStore), one record per cue, owned by the fact's owner.
- Hits found only through a cue are fetched from the store by id in one batch (``get_many``: the
  store declares ``capabilities.by_id``), so a deleted or changed fact is never served from a stale
  copy; their window neighbours come from the store too (``with_window``, where it declares
  ``window``). A hit that a cue won records it (:attr:`Hit.cue`). The wrapper declares what the
  wrapped store declares (its methods are reached through the wrapper), less ``cosine_scores``
  under centred scoring.
- Writes through the wrapper keep the index true: a fact whose text changed loses its old cues (and
  gets new ones when a :class:`~pgr_core.anticipation.cues.CueWriter` is attached); a deleted fact's cues go; a
  consolidated fact (``metadata["merged_from"]``) gets the union of its sources' cues.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pgr_core.anticipation.cue_trust import Alignment, CueTrust, session_of
from pgr_core.anticipation.cues import MAX_CUES, CueBatch, CueWriter, text_key, without_cues
from pgr_core.errors import ConfigurationError, InvalidArgumentError
from pgr_core.policy.centring import MemoryCentre, centrable
from pgr_core.stores.contract import AddsOneFact, Store
from pgr_core.types import Fact, Hit, Scope, SearchParams, fact_key

__all__ = [
    "AUTO",
    "CENTRED_DEPTH",
    "DEFAULT_CUE_WEIGHT",
    "SCORINGS",
    "Anticipating",
    "CueBuildReport",
    "can_centre",
    "cue_path_for",
]

DEFAULT_CUE_WEIGHT = 0.9
"""A cue's similarity counts this much against the fact's own (measured on MQ-lite dev: RESULTS.md)."""

SCORINGS = ("max", "centred")
AUTO = "auto"  # the default: "centred" where the store can be centred (it lists a scope's facts and
# reads or embeds their vectors), "max" where it cannot
CENTRED_DEPTH = 100  # facts (and cue_depth x as many cues) read per probe under scoring="centred"

_SEP = "~cue"


def _cue_owner(cue: Fact) -> str:
    """The key of the fact a cue record was written for (its ``fact_id``, its owner): a cue's typicality
    leaves its siblings out."""
    return fact_key(str(cue.metadata.get("fact_id") or cue.id), cue.scope)


def _cue_fact(cue: Fact) -> str | None:
    """The key of the fact a cue record (a hit's fact) speaks for; None for a record that names none."""
    fid = str(cue.metadata.get("fact_id") or "")
    return fact_key(fid, cue.scope) if fid else None


def _owned(cue: Fact) -> tuple[str, Scope]:
    """(id, owner) of the fact a cue record speaks for."""
    return str(cue.metadata.get("fact_id") or ""), cue.scope


def _grouped(facts: Iterable[tuple[str, Scope]]) -> dict[Scope, list[str]]:
    """Fact ids by owner (each owner is asked on its own: two agents of one user may hold the same id)."""
    out: dict[Scope, list[str]] = {}
    for fid, owner in facts:
        out.setdefault(owner, []).append(fid)
    return out


def _text_key(text: str) -> str:
    """What a cue record remembers of the text it was written for (a changed text makes it stale)."""
    return text_key(text)[:16]


def _by_owner(facts: Iterable[Fact]) -> dict[Scope, list[Fact]]:
    out: dict[Scope, list[Fact]] = {}
    for fact in facts:
        out.setdefault(fact.scope, []).append(fact)
    return out


def cue_path_for(store_path: str | Path) -> Path:
    """Where the CLI keeps a store's cue index: ``<DIR>/cues`` inside a directory store, and the
    directory ``<file>.cues`` beside a ``.pgr`` file (an EdgeStore either way: durable per write)."""
    path = Path(store_path)
    return path.with_name(path.name + ".cues") if path.suffix == ".pgr" or path.is_file() else path / "cues"


def cue_ids(fact_id: str, count: int = MAX_CUES * 3) -> list[str]:
    """The cue-record ids a fact may own (a merged fact may hold the union of several sets)."""
    return [f"{fact_id}{_SEP}{i}" for i in range(count)]


@dataclass
class CueBuildReport:
    """What a cue build did: facts that got cues (asked or cached), facts already cued, facts left
    without (retried next build), LLM calls and tokens, and per-session seconds."""

    facts: int = 0
    cued: int = 0
    cached: int = 0
    already: int = 0
    missing: int = 0
    sessions: int = 0
    asked_sessions: int = 0  # sessions that made at least one LLM call
    calls: int = 0
    tokens: int = 0
    cues: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    #: per session, the facts left without cues and why: {"session", "facts": [ids], "why"}
    without: list[dict[str, Any]] = field(default_factory=list)

    def add(self, batch: CueBatch, facts: int, session: str = "") -> None:
        self.sessions += 1
        self.asked_sessions += bool(batch.completions)
        self.facts += facts
        self.cued += len(batch.cues)
        self.cached += batch.cached
        self.missing += len(batch.missing)
        self.calls += batch.calls
        self.tokens += batch.tokens
        self.cues += sum(len(c) for c in batch.cues.values())
        self.seconds += sum(c.seconds for c in batch.completions)
        self.errors.extend(batch.errors[:3])
        self.without.extend(without_cues(batch, session))

    def merge(self, other: CueBuildReport) -> None:
        names = ("facts", "cued", "cached", "already", "missing", "sessions", "asked_sessions", "calls", "tokens")
        for name in (*names, "cues", "seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.errors.extend(other.errors[:3])
        self.without.extend(other.without)

    def to_dict(self) -> dict[str, Any]:
        asked = max(self.cued - self.cached, 0) + self.missing  # the facts sent to the model
        return {
            "facts": self.facts,
            "cued": self.cued,
            "from_cache": self.cached,
            "already_cued": self.already,
            "without_cues": self.missing,
            "sessions": self.sessions,
            "sessions_asked": self.asked_sessions,
            "llm_calls": self.calls,
            "tokens": self.tokens,
            "cues": self.cues,
            "calls_per_fact": round(self.calls / asked, 4) if asked else 0.0,
            "tokens_per_fact": round(self.tokens / asked, 1) if asked else 0.0,
            "seconds_per_session": round(self.seconds / self.asked_sessions, 2) if self.asked_sessions else 0.0,
            "errors": self.errors[:10],
            "without": self.without[:100],
        }


def _lowest(read: Iterable[tuple[float, Any, float]]) -> tuple[float, float]:
    """The lowest centred term and the lowest cosine among ``(term, _, cosine)`` rows (0.0 for none)."""
    rows = list(read)
    return min((r[0] for r in rows), default=0.0), min((r[2] for r in rows), default=0.0)


def can_centre(store: Store) -> bool:
    """Whether ``store``'s scores can be centred on a user's memory: they are cosines, and a
    :class:`MemoryCentre` can read the scope's vectors (:func:`~pgr_core.policy.centring.centrable`)."""
    return bool(store.capabilities.cosine_scores) and centrable(store, getattr(store, "embedder", None))


class Anticipating(AddsOneFact, Store):
    """``store`` searched through its facts' text and their cues.

    - ``cues``: the cue index: an InMemoryStore or EdgeStore (pgr's own), or a path (a directory
      opens an EdgeStore there). Default: ``<DIR>/cues`` for an EdgeStore, otherwise a fresh
      InMemoryStore on the store's embedder (give a path to keep cues across processes).
    - ``cue_weight``: a fact's score is ``max(own similarity, cue_weight × best cue similarity)``.
    - ``scoring``: ``"auto"`` (the default: ``"centred"`` where the store's scores are cosines and it
      can list a scope's facts and read or embed their vectors (:func:`can_centre`: pgr's own stores,
      QdrantStore; ``"max"`` where not, such as a Mem0Store or RetrieverStore given no embedder, or one
      not declared ``cosine_scores=True``), ``"max"`` (the rule above) or ``"centred"``: a fact scores its own
      similarity less its typicality (its cosine to the mean of the scope's facts,
      :mod:`pgr_core.policy.centring`) plus its best cue's similarity less that cue's typicality (against
      the mean of the scope's cues), over the probe's top :data:`CENTRED_DEPTH` facts and cues; a
      fact or cue the store did not read (beyond that depth, or below a cosine of 0) counts the
      lowest term read, and a fact with no cues at all counts its own term twice (it is not marked
      down for cues not written yet). Scores are then not cosines: each hit carries the two cosines
      behind its sum (``Hit.raw``: own plus best cue), window neighbours step down from that, and
      ``PGR`` does not centre them again. τ still reads a cosine: a fact is kept when its own
      similarity, or ``cue_weight`` × a cue's, reaches it.
    - cue trust, always on under ``scoring="centred"``: the cue term is weighted by how far the scope's
      cues point at their own fact rather than at another fact of the session they were written in
      (:mod:`pgr_core.anticipation.cue_trust`, no LLM, one figure per scope kept until a write there): in full
      where they do (MQ-lite), at :data:`~pgr_core.anticipation.cue_trust.TRUST_FLOOR` (0.2) where they tell their
      facts apart no better than chance (LoCoMo's chat turns with the local model: a misfiled cue still
      speaks of its session's subject); a fact alone in its session keeps its cue term in full (its
      cues were written with no other fact beside it).
      A fact's score is ``2 / (1 + w) x (own term + w x cue term)`` for a cue weight ``w``: the sum
      above at ``w = 1``, twice its own term at ``w = 0``. Every cue term in full, the option deleted,
      read 0.509 against 0.515 at recall@20 on LoCoMo conv-30 with the local model's cues and the same
      on MQ-lite with a capable model's (lab/RESULTS.md, "Cue trust"; docs/evidence.md).
    - typicality, under ``scoring="centred"``: a fact's is its cosine to the mean of the scope's facts, a
      cue's to the mean of the scope's cues (pgr's centring, CSLS's correction with the whole memory as
      the neighbourhood). Chosen by leave one user out on MQ-lite dev with a capable model's cues over
      reading it against the nearest share of the memory (docs/evidence.md).
    - ``writer``: a :class:`CueWriter`; with it, every fact written through the wrapper gets cues at
      once (one call per write batch). Without it, :meth:`build` backfills.
    """

    def __init__(
        self,
        store: Store,
        *,
        cues: Store | str | Path | None = None,
        cue_weight: float = DEFAULT_CUE_WEIGHT,
        writer: CueWriter | None = None,
        scoring: str = AUTO,
    ) -> None:
        if not isinstance(store, Store):
            raise InvalidArgumentError(f"Anticipating wraps a pgr Store, got {type(store).__name__}")
        if isinstance(store, Anticipating):
            raise InvalidArgumentError("this store already anticipates: wrap the inner store once")
        if isinstance(cue_weight, bool) or not isinstance(cue_weight, int | float) or not 0.0 < cue_weight <= 1.5:
            raise InvalidArgumentError(f"cue_weight must be a number in (0, 1.5], got {cue_weight!r}")
        if scoring not in (AUTO, *SCORINGS):
            raise InvalidArgumentError(
                f"scoring must be one of {', '.join(map(repr, (AUTO, *SCORINGS)))}, got {scoring!r}"
            )
        if scoring == AUTO:
            scoring = "centred" if can_centre(store) else "max"
        self.store = store
        self.cue_weight = float(cue_weight)
        self.scoring = scoring
        self.cue_depth = 2  # cue hits asked per probe: cue_depth x top_k (a fact has several cues)
        self.writer = writer
        try:
            self.cues = self._cue_index(store, cues)
        except BaseException:
            # an Anticipating owns the store it wraps (close() closes it): one that cannot be built
            # must not leave it open, its lock held, behind an error the caller cannot close
            _close(store)
            raise
        # the wrapped store's abilities, its methods reached through the wrapper (__getattr__; add_facts
        # and delete keep the cues in step); centred scores are not cosines (τ reads the ones behind them)
        cosine = store.capabilities.cosine_scores and scoring == "max"
        self.capabilities = replace(store.capabilities, cosine_scores=cosine)  # type: ignore[misc]
        self.name = f"anticipating:{getattr(store, 'name', type(store).__name__)}"
        # scoring="centred": the typicality of the scope's facts, and of its cues, and how far the scope's
        # cues point at their own fact (the cue term's weight); each rebuilt after a write in the scope
        self._centres: tuple[MemoryCentre, MemoryCentre] | None = None
        self._trust: CueTrust | None = None
        if scoring == "centred":
            embedder = getattr(store, "embedder", None)
            self._centres = (MemoryCentre(store, embedder), MemoryCentre(self.cues, embedder))
            self._trust = CueTrust(store, self.cues, embedder, self._cue_records)

    @staticmethod
    def _cue_index(store: Store, cues: Store | str | Path | None) -> Store:
        from pgr_core.stores.edge import EdgeStore
        from pgr_core.stores.memory import InMemoryStore

        embedder = getattr(store, "embedder", None)
        if isinstance(cues, Store):
            index = cues
        elif cues is not None:
            index = EdgeStore(Path(cues), embedder=embedder)
        elif isinstance(store, EdgeStore):
            index = EdgeStore(store.path / "cues", embedder=store.embedder)
        else:
            index = InMemoryStore(embedder=embedder)
        missing = [f for f in ("writable", "deletes", "lists") if not getattr(index.capabilities, f)]
        if missing:
            raise ConfigurationError(
                "the cue index must be a writable pgr store (InMemoryStore or EdgeStore) that declares "
                f"capabilities writable, deletes and lists (add_facts, delete, facts_for); "
                f"{type(index).__name__} does not declare {', '.join(missing)}"
            )
        return index

    def __repr__(self) -> str:
        return f"Anticipating({self.store!r}, cue_weight={self.cue_weight}, scoring={self.scoring!r})"

    def cue_alignment(self, scope: Scope | Mapping[str, str]) -> Alignment:
        """How far ``scope``'s cues point at their own fact, and the weight their term gets
        (:class:`~pgr_core.anticipation.cue_trust.Alignment`; nothing judged, trust 1, where it is not measured)."""
        owner = Scope.coerce(scope)
        return self._trust.alignment(owner) if self._trust is not None else Alignment()

    @property
    def judges_cues(self) -> bool:
        """Whether the cue term is weighted by each scope's cue trust (under ``scoring="centred"``)."""
        return self._trust is not None

    @property
    def centres_scores(self) -> bool:
        """Scores already centred on the caller's memory (``scoring="centred"``): PGR leaves them be."""
        return self.scoring == "centred"

    def __getattr__(self, name: str) -> Any:  # facts_for, get, embedder, save... of the wrapped store
        if name.startswith("__") or name in ("store", "cues"):
            raise AttributeError(name)
        return getattr(self.store, name)

    def __len__(self) -> int:
        return len(self.store)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ searching

    def search_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        if not probes:
            return []
        if self.scoring == "centred":
            return self._centred_search(probes, scope, params)
        base = self.store._checked_search(probes, scope, params)
        # a cue must reach min_score / cue_weight; above 1 none can (the cue score check below drops them)
        floor = min(params.min_score / self.cue_weight, 1.0)
        wide = SearchParams(top_k=params.top_k * self.cue_depth, min_score=floor, window=0)
        by_cue = self.cues._checked_search(probes, scope, wide)
        merged: list[list[tuple[float, Fact | str, str | None]]] = []
        missing: dict[str, tuple[str, Scope]] = {}  # fact key -> (id, owner) of a fact reached by a cue only
        for hits, cue_hits in zip(base, by_cue, strict=True):
            best: dict[str, tuple[float, Fact | str, str | None]] = {}
            for hit in hits:
                if hit.neighbour_of is None:
                    best[hit.key] = (hit.score, hit.fact, None)
            for hit in cue_hits:
                key = _cue_fact(hit.fact)
                score = self.cue_weight * hit.score
                if key is None or score < params.min_score:
                    continue
                held = best.get(key)
                if held is None:
                    best[key] = (score, key, hit.fact.text)
                    missing[key] = _owned(hit.fact)
                elif score > held[0]:
                    best[key] = (score, held[1], hit.fact.text)
            ranked = sorted(best.values(), key=lambda x: -x[0])
            # cue-only entries may turn out deleted; keep spares so top_k can still be filled
            merged.append(ranked[: params.top_k + len(missing)])
        fetched = self._fetch(missing) if missing else {}
        results: list[list[Hit]] = []
        for hits, entries in zip(base, merged, strict=True):
            windows: dict[str, list[Hit]] = {}
            for hit in hits:
                if hit.anchor is not None:
                    windows.setdefault(hit.anchor, []).append(hit)
            results.append(self._windowed(self._direct(entries, fetched, scope, params.top_k), windows, scope, params))
        return results

    @staticmethod
    def _direct(
        entries: Sequence[tuple[float, Fact | str, str | None]], fetched: Mapping[str, Fact], scope: Scope, top_k: int
    ) -> list[Hit]:
        """A probe's ranked (score, fact or key of a fact found through a cue, cue) entries as hits: a
        cue-only fact as the store gave it (gone or not the caller's: skipped), cut to ``top_k``."""
        direct: list[Hit] = []
        for score, fact, cue in entries:
            real = fetched.get(fact) if isinstance(fact, str) else fact
            if real is None or not scope.allows(real.scope):
                continue
            direct.append(Hit(fact=real, score=float(score), rank=len(direct), cue=cue))
            if len(direct) == top_k:
                break
        return direct

    def _centred_search(self, probes: Sequence[str], scope: Scope, params: SearchParams) -> list[list[Hit]]:
        """``scoring="centred"``: own and best-cue similarity, each less its typicality, summed."""
        assert self._centres is not None  # built with the wrapper when scoring="centred"
        facts_centre, cues_centre = self._centres
        depth = max(params.top_k, CENTRED_DEPTH)
        judged = self._trust.alignment(scope) if self._trust is not None else Alignment()
        base = self.store._checked_search(probes, scope, SearchParams(top_k=depth, min_score=0.0, window=0))
        read_cues = judged.cue_weight > 0.0 or bool(judged.lone)
        if read_cues:
            wide = SearchParams(top_k=depth * self.cue_depth, min_score=0.0, window=0)
            by_cue = self.cues._checked_search(probes, scope, wide)
        else:  # the scope's cues tell their facts apart no better than chance: its own text ranks a fact
            by_cue = [[] for _ in probes]
        facts_typical = facts_centre.typicality_of_hits(scope, base)
        cues_typical = cues_centre.typicality_of_hits(scope, by_cue)
        # per probe: fact key -> (centred own term, fact, cosine); fact key -> (best centred cue term, that
        # cue, its cosine); the facts τ keeps (it reads a cosine: the fact's own, or cue_weight x a cue's)
        read: list[tuple[dict[str, tuple[float, Fact, float]], dict[str, tuple[float, str, float]], list[str]]] = []
        owners: dict[str, tuple[str, Scope]] = {}  # fact key -> (id, owner), for the facts cues reached
        for hits, cue_hits in zip(base, by_cue, strict=True):
            own = {h.key: (h.score - facts_typical.get(h.key, 0.0), h.fact, h.score) for h in hits}
            keep = {h.key: None for h in hits if h.score >= params.min_score}
            cue: dict[str, tuple[float, str, float]] = {}
            for hit in cue_hits:
                key = _cue_fact(hit.fact)
                if key is None:
                    continue
                owners.setdefault(key, _owned(hit.fact))
                term = hit.score - cues_typical.get(hit.key, 0.0)
                if key not in cue or term > cue[key][0]:
                    cue[key] = (term, hit.fact.text, hit.score)
                if self.cue_weight * hit.score >= params.min_score:
                    keep[key] = None
            read.append((own, cue, list(keep)))
        # a fact with no cues at all (not written yet, or failed) is not marked down for it: its own term
        # stands for its cue term too, as if its text were its one cue (one lookup for the whole call)
        for own, _, _ in read:
            owners.update((key, (fact.id, fact.scope)) for key, (_, fact, _) in own.items())
        uncued = list(dict.fromkeys(f for _, cue, eligible in read for f in eligible if f not in cue))
        # at cue weight 0 the cue index is not read
        cued = self._cued([owners[k] for k in uncued], scope) if read_cues else set()
        merged: list[list[tuple[float, Fact | str, str | None]]] = []
        raws: list[dict[str, float]] = []  # per probe: fact key -> the cosines behind its centred sum
        missing: dict[str, tuple[str, Scope]] = {}
        for own, cue, eligible in read:
            # what the store did not read counts the lowest it read: term and cosine alike
            own_floor, own_low = _lowest(own.values())
            cue_floor, cue_low = _lowest(cue.values())
            raw: dict[str, float] = {}
            scored: list[tuple[float, Fact | str, str | None]] = []
            for fid in eligible:
                own_term, fact, own_cos = own[fid] if fid in own else (own_floor, fid, own_low)
                text: str | None = None
                if fid in cue:
                    cue_term, text, cue_cos = cue[fid]
                else:
                    cue_term, cue_cos = (cue_floor, cue_low) if fid in cued else (own_term, own_cos)
                # the cue term weighted by the scope's cue trust (in full for a fact alone in its session),
                # scaled back to two terms' worth so that facts of different weights compare
                w = judged.weight(fid)
                scale = 2.0 / (1.0 + w)
                raw[fid] = scale * (own_cos + w * cue_cos)
                # the hit names its cue where the cue counted for more than the fact's own text
                scored.append((scale * (own_term + w * cue_term), fact, text if w * cue_term > own_term else None))
                if fid not in own:
                    missing[fid] = owners[fid]
            ranked = sorted(scored, key=lambda x: -x[0])  # stable: ties keep the store's order
            merged.append(ranked[: params.top_k + len(missing)])
            raws.append(raw)
        fetched = self._fetch(missing) if missing else {}
        out: list[list[Hit]] = []
        for entries, raw in zip(merged, raws, strict=True):
            direct = self._direct(entries, fetched, scope, params.top_k)
            # the cosines behind each centred sum: window neighbours step down from them (ranking.earned_order)
            direct = [replace(h, raw=raw[h.key]) for h in direct]
            out.append(self._windowed(direct, {}, scope, params))
        return out

    def _cued(self, facts: Sequence[tuple[str, Scope]], scope: Scope) -> set[str]:
        """The keys of those of ``facts`` ((id, owner) pairs) that hold cues (a lookup of each fact's first
        cue record only)."""
        found = set()
        for owner, ids in _grouped(facts).items():
            found.update(_cue_owner(r) for r in self._cue_records(ids, owner, per_fact=1))
        return found

    def _cue_records(self, fact_ids: Iterable[str], scope: Scope, *, per_fact: int = MAX_CUES * 3) -> list[Fact]:
        """The cue records of ``fact_ids`` within ``scope``: the first ``per_fact`` cue ids of each, by id
        where the index fetches by id, else the scope's whole listing filtered."""
        wanted = set(fact_ids)
        if not wanted:
            return []
        if self.cues.capabilities.by_id:
            ids = [c for f in wanted for c in cue_ids(f, per_fact)]
            return list(self.cues.get_many(ids, scope=scope).values())  # type: ignore[attr-defined]
        listed = self.cues.facts_for(scope)  # type: ignore[attr-defined]
        return [r for r in listed if str(r.metadata.get("fact_id") or "") in wanted]

    def _fetch(self, facts: Mapping[str, tuple[str, Scope]]) -> dict[str, Fact]:
        """fact key -> the fact, for facts named by (id, owner): fetched owner by owner (two agents of one
        user may hold the same id)."""
        self.store.capabilities.require(
            "by_id", self.store, "Anticipating needs to return the facts found through their cues"
        )
        get_many = self.store.get_many  # type: ignore[attr-defined]
        out: dict[str, Fact] = {}
        for owner, ids in _grouped(facts.values()).items():
            out.update((f.key, f) for f in dict(get_many(ids, scope=owner)).values())
        return out

    def _windowed(
        self, direct: list[Hit], windows: dict[str, list[Hit]], scope: Scope, params: SearchParams
    ) -> list[Hit]:
        if not params.window:
            return direct
        need = [h for h in direct if h.key not in windows]
        if need and self.capabilities.window:  # the wrapped store's with_window
            with_window = self.store.with_window  # type: ignore[attr-defined]
            for neighbours in with_window(need, scope=scope, window=params.window).values():
                for n in neighbours:
                    windows.setdefault(n.anchor or "", []).append(replace(n, rank=0))
        out: list[Hit] = []
        for hit in direct:
            out.append(hit)
            out.extend(replace(n, rank=hit.rank) for n in windows.get(hit.key, []))
        return out

    # ------------------------------------------------------------------ writing

    def add_facts(self, facts: Iterable[Fact], *, vectors: Any = None) -> list[str]:
        """Write ``facts`` to the store, then bring their cues up to date (see the module doc)."""
        batch = list(facts)
        add = self.store.add_facts  # type: ignore[attr-defined]
        ids: list[str] = list(add(batch) if vectors is None else add(batch, vectors=vectors))
        written = [replace(f, id=i) if i != f.id else f for f, i in zip(batch, ids, strict=False)]
        self._refresh(written)
        return ids

    def delete(self, fact_ids: Iterable[str], *, scope: Scope | Mapping[str, str]) -> int:
        ids = [str(i) for i in fact_ids]
        removed = int(self.store.delete(ids, scope=scope))  # type: ignore[attr-defined]
        self.cues.delete([c for i in ids for c in cue_ids(i)], scope=scope)  # type: ignore[attr-defined]
        return removed

    def _refresh(self, facts: list[Fact]) -> None:
        for owner, owned in _by_owner(facts).items():
            todo, stale = self._uncued(owned, owner)
            if stale:
                self.cues.delete([c for f in stale for c in cue_ids(f.id)], scope=owner)  # type: ignore[attr-defined]
            union: dict[str, list[str]] = {}
            for fact in owned:
                sources = fact.metadata.get("merged_from") if isinstance(fact.metadata, Mapping) else None
                if isinstance(sources, list | tuple) and sources:
                    known = self.cues_of([str(s) for s in sources], scope=owner)
                    gathered = list(dict.fromkeys(c for s in sources for c in known.get(str(s), ())))
                    if gathered:
                        union[fact.id] = gathered[: MAX_CUES * 3]
            if union:
                self.put_cues({f.id: union[f.id] for f in owned if f.id in union}, [f for f in owned if f.id in union])
            if self.writer is not None:
                self._write_cues([f for f in todo if f.id not in union], self.writer)

    def cue(self, facts: Sequence[Fact], writer: CueWriter) -> CueBatch:
        """Write cues for those of ``facts`` (stored ones, one session's) that have none or have cues of
        an older text: one ``writer`` call for all of them. Returns the batch (cost, facts left out)."""
        todo = [f for owner, owned in _by_owner(facts).items() for f in self._uncued(owned, owner)[0]]
        return self._write_cues(todo, writer)

    def _uncued(self, facts: Sequence[Fact], scope: Scope) -> tuple[list[Fact], list[Fact]]:
        """Of ``facts`` (within ``scope``): those with no cues or with cues of an older text, and of
        those, the ones whose old cues are still held."""
        held = self.cues_of([f.id for f in facts], scope=scope, with_keys=True)
        todo = [f for f in facts if f.id not in held or held[f.id][0] != _text_key(f.text)]
        return todo, [f for f in todo if f.id in held]

    def _write_cues(self, todo: Sequence[Fact], writer: CueWriter) -> CueBatch:
        if not todo:
            return CueBatch()
        batch = writer.write(todo)
        self.put_cues(batch.cues, todo)
        return batch

    def close(self) -> None:
        """Close the wrapped store and the cue index (an EdgeStore releases its lock)."""
        for part in (self.cues, self.store):
            _close(part)

    def __enter__(self) -> Anticipating:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def put_cues(self, cues: Mapping[str, Sequence[str]], facts: Sequence[Fact]) -> int:
        """Store ``cues`` (fact id → cue texts) for ``facts`` (their owners and texts); replaces any
        cues those facts had. Returns how many cue records were written."""
        by_id = {f.id: f for f in facts}
        records: list[Fact] = []
        for fid, texts in cues.items():
            fact = by_id.get(fid)
            if fact is None or not texts:
                continue
            for i, text in enumerate(texts):
                records.append(
                    Fact(
                        id=cue_ids(fid)[i],
                        text=text,
                        scope=fact.scope,
                        type="cue",
                        metadata={"fact_id": fid, "cue": i, "fact_key": _text_key(fact.text)},
                    )
                )
        owners = {f.scope for f in by_id.values() if f.id in cues}
        for owner in owners:
            old = [c for f in by_id.values() if f.scope == owner and f.id in cues for c in cue_ids(f.id)]
            self.cues.delete(old, scope=owner)  # type: ignore[attr-defined]
        if records:
            self.cues.add_facts(records)  # type: ignore[attr-defined]
        return len(records)

    def cues_of(
        self, fact_ids: Sequence[str], *, scope: Scope | Mapping[str, str], with_keys: bool = False
    ) -> dict[str, Any]:
        """The cues held for ``fact_ids`` within ``scope``: fact id → cue texts (with ``with_keys``,
        fact id → (text key of the fact they were written for, cue texts))."""
        found: dict[str, list[tuple[int, str, str]]] = {}
        for record in self._cue_records(fact_ids, Scope.coerce(scope)):
            fid = str(record.metadata.get("fact_id") or "")
            found.setdefault(fid, []).append(
                (int(record.metadata.get("cue") or 0), record.text, str(record.metadata.get("fact_key") or ""))
            )
        out: dict[str, Any] = {}
        for fid, rows in found.items():
            rows.sort()
            texts = tuple(r[1] for r in rows)
            out[fid] = (rows[0][2], texts) if with_keys else texts
        return out

    def build(
        self,
        writer: CueWriter,
        *,
        scope: Scope | Mapping[str, str],
        progress: Callable[[int, int], None] | None = None,
    ) -> CueBuildReport:
        """Backfill cues for every fact ``scope`` allows that has none (or has cues for an older text),
        one LLM call per session. Resumable: facts already cued are skipped, and a fact the model gave
        no usable cues is simply left for the next build. ``progress(done, total)`` after each session.
        """
        scope = Scope.coerce(scope)
        self.store.capabilities.require("lists", self.store, "backfilling cues needs")
        facts: list[Fact] = list(self.store.facts_for(scope))  # type: ignore[attr-defined]
        report = CueBuildReport()
        todo = self._uncued(facts, scope)[0]
        report.already = len(facts) - len(todo)
        sessions: dict[tuple[Scope, str], list[Fact]] = {}
        for fact in todo:
            sessions.setdefault((fact.scope, session_of(fact)), []).append(fact)
        for done, ((_, session), group) in enumerate(sessions.items(), 1):
            report.add(self._write_cues(group, writer), len(group), session)
            if progress is not None:
                progress(done, len(sessions))
        return report


def _close(part: object) -> None:
    close = getattr(part, "close", None)
    if callable(close):
        close()
