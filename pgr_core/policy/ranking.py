"""How R* is ordered for a budget: which facts a user with room for ``n`` gets from ``result.top(n)``.

A user puts a fixed number of facts into a prompt, so the order of R* decides what prospection is
worth: a fact that only a step probe found helps only if it can outrank a query hit. Two orders,
chosen by ``PGRConfig.ranking``:

- ``"llm"`` (the default): the summary call also names the records that matter, most important
  first; they lead, and the shared order fills the rest. A reply that does not choose (the records'
  own order echoed, unknown ids, fewer than ``min_chosen``) is ignored and the shared order used;
  the trace says why.
- ``"shared"``: the budget is shared. Every prefix of R* gives the query's own list ``query_share``
  of its slots (its hits in their order; with an LLM the restatement q_A is probed too, and each
  fact is at its best score over the request's list and q_A's) and the step probes the rest,
  filled round-robin over the probes (every probe's best hit, then every probe's second...); a fact
  that several step probes returned moves up one round per extra probe, and goes first among its
  round. A fact both lists hold takes the first slot either gives it.

Two more orders are internal: :func:`summed_order` (a grounded prospector's, the feedback round's:
each fact at the sum of its centred scores) and :func:`fused_order` (best weighted reciprocal rank:
what an adaptive skip keeps, and how facts no pool ranked follow the rest).

Window neighbours earn their places (``PGRConfig.neighbour_decay`` = γ, 0.8): in each probe's list a
neighbour ``d`` turns from its anchor scores γ^d x the anchor's score and is ranked among the direct
hits by that score (:func:`earned_order`), so the pools above hold it at its own rank. Under
``"llm"`` a chosen fact still brings its window neighbours right behind it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from pgr_core.observability.trace import FoundFact, Probe
from pgr_core.types import Hit

__all__ = [
    "RANKINGS",
    "Choice",
    "choose",
    "earned_order",
    "fused_order",
    "llm_order",
    "shared_order",
    "summed_order",
]

RANKINGS = ("llm", "shared")  # PGRConfig.ranking; "summed" is a grounded prospector's own order
# The options measured and deleted (docs/evidence.md): "scored" (best centred score, step_margin),
# "summed" for the LLM strategies, and "fused" (the query's top 20 first: prospection only appends).
QUERY_SIDE = ("query", "intent")  # the request and its restatement q_A: the query's share of R*


def earned_order(hits: Sequence[Hit], decay: float, raw: Mapping[str, float] | None = None) -> list[Hit]:
    """One probe's list with each window neighbour ranked by what it earns, ``rank`` renumbered.

    A neighbour ``d`` turns from its anchor (1 when either has no position) earns ``decay**d`` x the
    anchor's score (a negative score is divided instead, so it still ranks below its anchor); one that
    several anchors bring keeps the most it earns, and a fact the probe also hit directly keeps its
    direct place. Ties keep the store's order, so an anchor stays ahead of its neighbours.

    ``raw``: the anchors' own cosines when their scores are centred (:mod:`pgr_core.policy.centring`). A
    neighbour then loses what it would lose in cosine, ``(1 - decay**d) x`` the anchor's cosine, from
    the anchor's centred score: the same step down as uncentred, where a fraction of a small centred
    score would be almost none and every neighbour would ride behind its anchor again.

    >>> from pgr_core.types import Fact, Scope
    >>> def turn(i, pos): return Fact(f"t{i}", "x", Scope(user_id="u"), session_id="s", position=pos)
    >>> hits = [Hit(turn(1, 5), 0.9, 0), Hit(turn(2, 9), 0.6, 1), Hit(turn(3, 6), 0.0, 0, neighbour_of="t1")]
    >>> [(h.fact.id, h.rank, round(h.score, 2)) for h in earned_order(hits, 0.8)]
    [('t1', 0, 0.9), ('t3', 1, 0.72), ('t2', 2, 0.6)]
    """
    direct = {h.key: h for h in hits if h.neighbour_of is None}
    best: dict[str, tuple[int, Hit]] = {}  # fact key -> (its place in the store's list, the hit as scored)
    for at, hit in enumerate(hits):
        if hit.anchor is None:
            best.setdefault(hit.key, (at, hit))
            continue
        anchor = direct.get(hit.anchor)
        if anchor is None or hit.key in direct:
            continue
        a, n = anchor.fact.position, hit.fact.position
        factor = decay ** (abs(n - a) if a is not None and n is not None and n != a else 1)
        if raw is not None and hit.anchor in raw:
            earned = anchor.score - (1 - factor) * abs(raw[hit.anchor])
        else:
            earned = anchor.score * factor if anchor.score >= 0 else anchor.score / factor
        if hit.key not in best or earned > best[hit.key][1].score:
            best[hit.key] = (at, replace(hit, score=earned))
    ranked = sorted(best.values(), key=lambda entry: (-entry[1].score, entry[0]))
    return [replace(hit, rank=rank) for rank, (_, hit) in enumerate(ranked)]


def fused_order(found: Mapping[str, FoundFact]) -> list[FoundFact]:
    """Best weighted reciprocal rank first (the query's own list weighted 1.5: its top 20 first),
    ties by cosine."""
    return sorted(found.values(), key=lambda f: (-f.rank_score, -f.score))


@dataclass
class _Pools:
    query: list[str] = field(default_factory=list)  # the query's direct hits, in its order
    steps: list[str] = field(default_factory=list)  # step-found facts, in the shared order


def _query_pool(found: Mapping[str, FoundFact], probes: Sequence[Probe]) -> list[str]:
    """The query's own list; with the restatement q_A probed too, each fact at its best score over the
    two (both lists are scored alike: the same store, the same centring), ties to the request's own."""
    texts = list(dict.fromkeys(pr.text for pr in probes))
    if len(texts) <= 1:  # the request alone (perhaps probed in more than one round): its own order
        query_rank: dict[str, int] = {}
        for probe in probes:
            for rank, fid in enumerate(_ranked_ids(probe)):
                if fid in found:
                    query_rank[fid] = min(query_rank.get(fid, rank), rank)
        return sorted(query_rank, key=lambda fid: query_rank[fid])
    # each fact at its least (-score, which probe, rank) over the two lists
    keys = ((fid, (-score, texts.index(pr.text), rank)) for pr in probes for rank, fid, score in _scored_ids(pr))
    return _best_first(found, keys)


def _scored_ids(probe: Probe) -> Iterator[tuple[int, str, float]]:
    """A probe's list as ranked, each fact with its score: a window neighbour has no score of its own,
    so it takes the score of the hit before it (it keeps its place just below that hit)."""
    scores = dict(probe.hits)
    last = math.inf
    for rank, fid in enumerate(_ranked_ids(probe)):
        last = scores.get(fid, last)
        yield rank, fid, last


def _best_first(found: Mapping[str, FoundFact], keys: Iterable[tuple[str, tuple[float, int, int]]]) -> list[str]:
    """The ids of ``found`` among ``keys``, each at its least key, least first."""
    best: dict[str, tuple[float, int, int]] = {}
    for fid, key in keys:
        if fid in found and (fid not in best or key < best[fid]):
            best[fid] = key
    return sorted(best, key=best.__getitem__)


def _led_by(ids: Iterable[str], neighbours: Mapping[str, Sequence[str]], found: Mapping[str, FoundFact]) -> list[str]:
    """``ids`` in order, each followed by its window neighbours (the chosen facts of ``"llm"``); each
    fact of ``found`` once."""
    out: dict[str, None] = {}
    for fid in ids:
        for item in (fid, *neighbours.get(fid, ())):
            if item in found:
                out.setdefault(item)
    return list(out)


def _pools(found: Mapping[str, FoundFact], probes: Iterable[Probe]) -> _Pools:
    probes = list(probes)
    step_hits: dict[str, list[tuple[int, int]]] = {}  # fact id -> (rank, probe order) per step probe
    order = 0
    for probe in probes:
        if probe.source in QUERY_SIDE:
            continue
        seen: set[str] = set()
        for rank, fid in enumerate(_ranked_ids(probe)):
            if fid in found and fid not in seen:
                seen.add(fid)
                step_hits.setdefault(fid, []).append((rank, order))
        order += 1
    pools = _Pools()
    pools.query = _query_pool(found, [pr for pr in probes if pr.source in QUERY_SIDE])

    # round-robin over the probes (every probe's best hit, then every probe's second...), a fact that
    # several probes returned moved up one round per extra probe (and first among its round): agreement
    # counts, but a weak fact every probe grazes cannot outrank what each probe found best
    def key(fid: str) -> tuple[int, int, int, int]:
        rank, order = min(step_hits[fid])
        return (rank - (len(step_hits[fid]) - 1), -len(step_hits[fid]), rank, order)

    pools.steps = sorted(step_hits, key=key)  # window neighbours are in the lists, at their earned ranks
    return pools


def _ranked_ids(probe: Probe) -> list[str]:
    """A probe's list as ranked: hits and neighbours in their earned order, or its direct hits."""
    return probe.order or [fid for fid, _ in probe.hits]


def _neighbours(found: Mapping[str, FoundFact]) -> dict[str, list[str]]:
    """Anchor id -> the facts its window brought in (a direct hit too: it then follows a chosen anchor,
    as a neighbour would; the query-only list does the same)."""
    out: dict[str, list[str]] = {}
    for fid, f in found.items():
        for anchor in f.beside:
            out.setdefault(anchor, []).append(fid)
    return out


def shared_order(found: Mapping[str, FoundFact], probes: Iterable[Probe], query_share: float) -> list[FoundFact]:
    """The shared order (see the module docstring); facts in neither pool follow by fused rank."""
    pools = _pools(found, probes)
    out: list[str] = []
    placed: set[str] = set()
    taken = {"query": 0, "steps": 0}
    cursor = {"query": 0, "steps": 0}
    lists = {"query": pools.query, "steps": pools.steps}

    def next_of(pool: str) -> str | None:
        """The pool's next fact not placed yet (the other pool may have placed it)."""
        items = lists[pool]
        while cursor[pool] < len(items):
            fid = items[cursor[pool]]
            cursor[pool] += 1
            if fid not in placed:
                return fid
        return None

    while True:
        # the query's turn while it holds less than its share of the slots filled so far (and the next)
        want = "query" if taken["query"] < math.ceil(query_share * (len(out) + 1) - 1e-9) else "steps"
        other = "steps" if want == "query" else "query"
        fid = next_of(want)
        pool = want
        if fid is None:
            fid, pool = next_of(other), other
        if fid is None:
            break
        placed.add(fid)
        out.append(fid)
        taken[pool] += 1
    rest = [f for f in fused_order(found) if f.key not in placed]
    return [found[i] for i in out] + rest


def _with_the_rest(found: Mapping[str, FoundFact], ids: Iterable[str]) -> list[FoundFact]:
    """``ids`` in order (window neighbours are among them, at their earned ranks), then the facts no
    probe ranked, by fused rank."""
    out = [fid for fid in dict.fromkeys(ids) if fid in found]
    placed = set(out)
    return [found[i] for i in out] + [f for f in fused_order(found) if f.key not in placed]


def summed_order(found: Mapping[str, FoundFact], probes: Iterable[Probe]) -> list[FoundFact]:
    """Each fact at the sum of its scores over the probes; a probe that did not read a fact gives it
    the lowest score it read (so a fact one probe missed is not ranked as if it scored zero there).
    Ties go to the request's own order. A window neighbour takes the score of the hit before it in each
    list, as it was ranked there (:func:`earned_order`). Facts no probe ranked follow by fused rank. The
    ``"feedback"`` strategy's order, where the scores are centred, so they add up across probes.

    >>> from pgr_core.types import Fact, Scope
    >>> found = {i: FoundFact(Fact(i, i, Scope(user_id="u")), 0.0, 0.0, 1, "q") for i in "abcd"}
    >>> request = Probe("q", "query", hits=[("a", 0.30), ("b", 0.28), ("c", 0.10)])
    >>> step = Probe("q + a", "step", "r1.1", hits=[("c", 0.45), ("a", 0.35), ("d", 0.05)])
    >>> [f.id for f in summed_order(found, [request, step])]
    ['a', 'c', 'b', 'd']
    """
    probes = [pr for pr in probes if pr.hits]
    request_rank: dict[str, int] = {}
    lists: list[dict[str, float]] = []
    for probe in probes:
        scores: dict[str, float] = {}
        for rank, fid, score in _scored_ids(probe):
            scores.setdefault(fid, score)
            if probe.source == "query":
                request_rank.setdefault(fid, rank)
        lists.append(scores)
    lowest = [min(scores.values()) for scores in lists]
    ids = {fid for scores in lists for fid in scores if fid in found}
    totals = {fid: sum(scores.get(fid, low) for scores, low in zip(lists, lowest, strict=True)) for fid in ids}
    ordered = sorted(totals, key=lambda fid: (-totals[fid], request_rank.get(fid, math.inf)))
    return _with_the_rest(found, ordered)


@dataclass
class Choice:
    """What the LLM-chosen order did: the ids it put first, or why its reply was ignored."""

    chosen: list[str]
    fallback: str | None = None  # None: the choice was used


def choose(reply: object, shown: Sequence[str], *, min_chosen: int = 3, known: Iterable[str] = ()) -> Choice:
    """Read the ids a summary reply named (record labels like ``"r3"`` or 3, or fact ids) against the
    records it was shown (``shown``: fact ids in the order given). A non-choice falls back.

    >>> choose(["r2", "r4", "r1"], ["a", "b", "c", "d"]).chosen
    ['b', 'd', 'a']
    >>> choose(["r1", "r2", "r3"], ["a", "b", "c", "d"]).fallback
    'echo: the records were named in the order they were given'
    """
    if not isinstance(reply, list) or not reply:
        return Choice([], "no ids in the reply")
    ids: list[str] = []
    by_fact = set(known) | set(shown)
    for item in reply:
        label = str(item).strip().lower().lstrip("#")
        label = label[1:] if label[:1] in ("r", "m") and label[1:].isdigit() else label
        if label.isdigit():
            index = int(label) - 1
            if not 0 <= index < len(shown):
                return Choice([], f"id out of range: {_short(item)} (records r1..r{len(shown)})")
            fid = shown[index]
        elif str(item) in by_fact:
            fid = str(item)
        else:
            return Choice([], f"unknown id: {_short(item)}")
        if fid not in ids:
            ids.append(fid)
    if len(ids) < min(min_chosen, len(shown)):
        return Choice([], f"too few: {len(ids)} id(s), at least {min(min_chosen, len(shown))} wanted")
    if ids == list(shown[: len(ids)]):
        return Choice([], "echo: the records were named in the order they were given")
    return Choice(ids)


def _short(item: object, limit: int = 80) -> str:
    """An id as the trace names it: a hostile reply's "id" can be megabytes."""
    text = repr(item)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def llm_order(
    found: Mapping[str, FoundFact], probes: Iterable[Probe], query_share: float, chosen: Sequence[str]
) -> list[FoundFact]:
    """The chosen facts first (each with its window neighbours), then the shared order."""
    shared = shared_order(found, probes, query_share)
    out = _led_by(chosen, _neighbours(found), found)
    first = set(out)
    return [found[i] for i in out] + [f for f in shared if f.key not in first]
