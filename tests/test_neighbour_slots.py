"""Window neighbours earn their slot (issue 10): a neighbour d turns from its anchor scores γ^d x the
anchor's score and is ranked among the direct hits by it, so it displaces a direct hit only when it
outscores it. The old order (``neighbour_decay=None``: every neighbour right behind its anchor) lost
and was deleted; None is refused."""

from __future__ import annotations

import numpy as np
import pytest

from pgr_core import PGR, Fact, FoundFact, InMemoryStore, Probe, Scope
from pgr_core.errors import InvalidArgumentError
from pgr_core.models.embedders import Embedder
from pgr_core.policy.ranking import earned_order, shared_order
from pgr_core.types import Hit

U = Scope(user_id="u1")


def turn(fid: str, pos: int | None, session: str | None = "s") -> Fact:
    return Fact(id=fid, text=fid, scope=U, session_id=session, position=pos)


def test_earned_order_by_hand() -> None:
    a, b, c = turn("a", 10), turn("b", 40), turn("c", 70)
    hits = [
        Hit(a, 0.90, 0),
        Hit(b, 0.70, 1),
        Hit(c, 0.50, 2),
        Hit(turn("a+1", 11), 0.0, 0, neighbour_of="a"),  # 0.8 x 0.90 = 0.72: ahead of b
        Hit(turn("a+2", 12), 0.0, 0, neighbour_of="a"),  # 0.64 x 0.90 = 0.576: between b and c
        Hit(turn("c-1", 69), 0.0, 2, neighbour_of="c"),  # 0.8 x 0.50 = 0.40: last
        Hit(b, 0.0, 0, neighbour_of="c"),  # b is a direct hit too: it keeps its own place
    ]
    got = [(h.fact.id, h.rank, round(h.score, 3), h.neighbour_of) for h in earned_order(hits, 0.8)]
    assert got == [
        ("a", 0, 0.9, None),
        ("a+1", 1, 0.72, "a"),
        ("b", 2, 0.7, None),
        ("a+2", 3, 0.576, "a"),
        ("c", 4, 0.5, None),
        ("c-1", 5, 0.4, "c"),
    ]


def test_a_neighbour_of_two_anchors_keeps_the_most_it_earns_and_no_position_counts_as_one_turn() -> None:
    x, y = turn("x", None, None), turn("y", None, None)
    shared = turn("n", None, None)
    hits = [Hit(x, 0.6, 0), Hit(y, 0.5, 1)]
    hits += [Hit(shared, 0.0, 1, neighbour_of="y"), Hit(shared, 0.0, 0, neighbour_of="x")]
    got = [(h.fact.id, round(h.score, 3), h.neighbour_of) for h in earned_order(hits, 0.5)]
    assert got == [("x", 0.6, None), ("y", 0.5, None), ("n", 0.3, "x")]


def test_a_negative_anchor_score_still_ranks_its_neighbour_below_it() -> None:
    hits = [Hit(turn("a", 1), -0.2, 0), Hit(turn("a+1", 2), 0.0, 0, neighbour_of="a")]
    got = [(h.fact.id, round(h.score, 3)) for h in earned_order(hits, 0.8)]
    assert got == [("a", -0.2), ("a+1", -0.25)]


class Axis(Embedder):
    """Each text's vector is given by hand: the query is the unit x axis, a fact's cosine its x part."""

    name = "axis"
    dim = 2

    def __init__(self, cosines: dict[str, float]) -> None:
        self.cosines = cosines

    def embed(self, texts: list[str]) -> np.ndarray:  # type: ignore[override]
        rows = []
        for t in texts:
            c = self.cosines.get(t, 1.0)
            rows.append([c, float(np.sqrt(max(0.0, 1 - c * c)))])
        return np.asarray(rows, dtype=np.float32)


def _store() -> InMemoryStore:
    # one session of 8 turns: a strong hit at turn 1 (0.9) and a weaker one at turn 6 (0.5); two direct
    # hits elsewhere (0.85, 0.6) with no neighbours; the other turns score low, each differently
    cosines = {"q": 1.0, "t1": 0.9, "d1": 0.85, "d2": 0.6, "t6": 0.5}
    cosines.update({"t0": 0.12, "t2": 0.11, "t5": 0.10, "t7": 0.09, "t3": 0.05, "t4": 0.04})
    store = InMemoryStore(embedder=Axis(cosines))
    facts = [turn(f"t{i}", i) for i in range(8)]
    facts += [Fact(id=d, text=d, scope=U, session_id=f"other-{d}", position=0) for d in ("d1", "d2")]
    store.add_facts(facts)
    return store


def test_a_neighbour_displaces_a_direct_hit_only_when_it_outscores_it() -> None:
    store = _store()
    # t1's neighbours earn 0.8 x 0.9 = 0.72: below d1 (0.85), above d2 (0.6)
    assert PGR(store, window=1).query_only("q", scope=U, top_k=2).ids == ["t1", "d1"]
    assert PGR(store, window=1).query_only("q", scope=U, top_k=4).ids == ["t1", "d1", "t0", "t2"]


def test_retrieve_ranks_r_star_by_the_earned_order_and_the_trace_keeps_it() -> None:
    store = _store()
    earned = PGR(store, strategy="none", window=1, query_top_k=4, centring=None).retrieve("q", scope=U)
    assert earned.ids[:8] == ["t1", "d1", "t0", "t2", "d2", "t6", "t5", "t7"]  # t6's neighbours earn 0.4
    probe = earned.trace.rounds[0].probes[0]
    assert probe.order == ["t1", "d1", "t0", "t2", "d2", "t6", "t5", "t7"]
    assert [fid for fid, _ in probe.hits] == ["t1", "d1", "d2", "t6"]
    assert set(probe.neighbours) == {"t0", "t2", "t5", "t7"}


def test_shared_order_uses_a_probes_earned_order() -> None:
    found = {i: FoundFact(Fact(id=i, text=i, scope=U), 0.5, 0.0, 1, "p") for i in ["q1", "q2", "a1", "n"]}
    found["n"].via, found["n"].beside = "neighbour", ["q1"]
    query = Probe(text="q", source="query", hits=[("q1", 0.9), ("q2", 0.8)], neighbours=["n"], order=["q1", "q2", "n"])
    step = Probe(text="s", source="step", hits=[("a1", 0.5)])
    # earned: n ranked third in the query's list, so it takes the query's third slot, not the second
    assert [f.id for f in shared_order(found, [query, step], 0.75)] == ["q1", "q2", "n", "a1"]


@pytest.mark.parametrize("bad", [None, 0, 0.0, -0.5, 1.5, True, "0.8"])
def test_neighbour_decay_is_checked(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"neighbour_decay must be a number in \(0, 1\]"):
        PGR(InMemoryStore(), neighbour_decay=bad)  # type: ignore[arg-type]


def test_none_for_neighbour_decay_says_the_old_order_was_deleted() -> None:
    with pytest.raises(InvalidArgumentError, match=r"got None .*deleted"):
        PGR(InMemoryStore(), neighbour_decay=None)  # type: ignore[arg-type]
