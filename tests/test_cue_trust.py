"""Cue trust: a scope whose cues point at their own fact keeps the cue term in full; one whose cues read
as their session neighbours' (what the local model wrote for LoCoMo's chat turns) keeps it at
TRUST_FLOOR only."""

from __future__ import annotations

import doctest
from pathlib import Path

import numpy as np
import pytest

import pgr_core.anticipation.cue_trust as cue_trust
from pgr_core import Anticipating, Fact, HashingEmbedder, InMemoryStore, Scope
from pgr_core.anticipation.cue_trust import MIN_JUDGED, TRUST_FLOOR, TRUST_FULL, Alignment, alignment
from pgr_core.types import SearchParams

U1 = Scope(user_id="u1")
U2 = Scope(user_id="u2")
WORDS = (
    "violin harbour glacier pepper lantern orchid tractor saddle quartz meadow falcon ribbon "
    "canyon walnut trumpet pillow copper lagoon marble thimble beacon cactus donkey ember "
    "fossil gravel hammock igloo jigsaw kettle ledger mango nectar oyster pebble quiver "
    "raisin sprocket tundra umbrella velvet wombat yogurt zipper anchor bramble chimney dagger "
    "easel fjord goblet hazel ivory jasmine kayak lentil mortar nutmeg obelisk parsley quill "
    "rhubarb satchel tinsel urchin vortex wicker yarrow zephyr acorn bistro cobalt dingo "
    "elbow flannel gazebo hornet inkwell jockey kiln locust mitten nozzle okra paddle "
    "quinoa radish sequin trowel ukulele vinyl waffle yodel zinnia almond biscuit cobweb"
).split()
SESSIONS, PER_SESSION = 8, 3


def user_facts(scope: Scope) -> list[Fact]:
    """Eight sessions of three facts, each fact four words no other fact has."""
    out = []
    for s in range(SESSIONS):
        for p in range(PER_SESSION):
            i = s * PER_SESSION + p
            text = " ".join(WORDS[4 * i : 4 * i + 4])
            out.append(Fact(id=f"{scope.user_id}-f{i}", text=text, scope=scope, session_id=f"s{s}", position=p))
    return out


def own_cues(fact: Fact) -> list[str]:
    """Two cues that share their fact's words: they point at it."""
    w = fact.text.split()
    return [f"a plan with the {w[0]} and the {w[1]}", f"what about {w[2]} or {w[3]}"]


def rotated(facts: list[Fact]) -> dict[str, list[str]]:
    """Each fact gets the cues of the next fact of its session: every cue set reads as a neighbour's."""
    out: dict[str, list[str]] = {}
    for s in range(SESSIONS):
        members = facts[s * PER_SESSION : (s + 1) * PER_SESSION]
        for at, fact in enumerate(members):
            out[fact.id] = own_cues(members[(at + 1) % PER_SESSION])
    return out


def wrapped() -> tuple[Anticipating, InMemoryStore]:
    inner = InMemoryStore(embedder=HashingEmbedder(dim=1024))
    inner.add_facts([*user_facts(U1), *user_facts(U2)])
    return Anticipating(inner, scoring="centred"), inner


def test_the_module_examples_hold() -> None:
    assert doctest.testmod(cue_trust).failed == 0


def test_alignment_is_chance_corrected_and_trust_needs_enough_judged() -> None:
    eye = np.eye(4)
    perfect = alignment(eye, [[0, 1], [2, 3]], {i: eye[[i]] for i in range(4)})
    assert (perfect.judged, perfect.aligned, perfect.chance) == (4, 4, 2.0)
    assert perfect.kappa == 1.0
    swapped = alignment(eye, [[0, 1], [2, 3]], {0: eye[[1]], 1: eye[[0]], 2: eye[[3]], 3: eye[[2]]})
    assert swapped.aligned == 0 and swapped.kappa == -1.0
    lone = alignment(eye, [[0], [1, 2, 3]], {0: eye[[0]]})  # a fact alone in its session is not judged
    assert lone.judged == 0 and lone.kappa == 1.0
    # too few judged: the cues count in full whatever they say
    assert Alignment(judged=MIN_JUDGED - 1, aligned=0, chance=5.0).trust == 1.0
    # enough judged: linear in kappa up to TRUST_FULL, then full; never below 0
    chance = MIN_JUDGED / 3
    kappa = (5 - chance) / (MIN_JUDGED - chance)
    assert 0 < kappa < TRUST_FULL
    assert Alignment(MIN_JUDGED, 5, chance).trust == pytest.approx(kappa / TRUST_FULL)
    assert Alignment(MIN_JUDGED, 0, chance).trust == 0.0
    assert Alignment(MIN_JUDGED, MIN_JUDGED, chance).trust == 1.0
    # the cue term's weight: the trust, never below TRUST_FLOOR
    assert 0.0 < TRUST_FLOOR < 1.0
    assert Alignment(MIN_JUDGED, 0, chance).cue_weight == pytest.approx(TRUST_FLOOR)
    assert Alignment(MIN_JUDGED, 5, chance).cue_weight == pytest.approx(kappa / TRUST_FULL)  # above the floor
    low, mid = Alignment(100, 51, 50.0), Alignment(100, 53, 50.0)  # kappa 0.02 and 0.06
    assert low.trust == pytest.approx(0.1) and low.cue_weight == pytest.approx(TRUST_FLOOR)
    assert mid.trust == pytest.approx(0.3) and mid.cue_weight == pytest.approx(0.3)
    assert Alignment(MIN_JUDGED, MIN_JUDGED, chance).cue_weight == 1.0
    assert Alignment().cue_weight == 1.0  # nothing judged: in full


def test_cues_that_point_at_their_own_fact_count_in_full() -> None:
    store, _ = wrapped()
    facts = user_facts(U1)
    store.put_cues({f.id: own_cues(f) for f in facts}, facts)
    found = store.cue_alignment(U1)
    assert (found.judged, found.aligned) == (len(facts), len(facts))
    assert found.trust == 1.0
    assert store.cue_alignment({"user_id": "u1"}) == found  # a mapping scope reads the same


def mixed_up() -> tuple[list[Fact], Fact, Fact, str, SearchParams]:
    """A user whose every cue set is its session neighbour's; a probe that is the target's own cue."""
    facts = user_facts(U1)
    # the third session's first fact; its neighbour holds its cues once rotated
    target, neighbour = facts[2 * PER_SESSION], facts[3 * PER_SESSION - 1]
    return facts, target, neighbour, own_cues(target)[0], SearchParams(top_k=5, min_score=0.0)


def test_cues_that_read_as_a_neighbours_count_at_the_floor_only(monkeypatch: pytest.MonkeyPatch) -> None:
    facts, target, neighbour, probe, params = mixed_up()
    # the blind rule: the same cues with too few judged (MIN_JUDGED beyond them all), so they count in full
    with monkeypatch.context() as patched:
        patched.setattr(cue_trust, "MIN_JUDGED", 10**6)
        blind, _ = wrapped()
        blind.put_cues(rotated(facts), facts)
        assert blind.cue_alignment(U1).cue_weight == 1.0
        blind_hits = blind.search_batch([probe], scope=U1, params=params)[0]
    trusting, _ = wrapped()
    trusting.put_cues(rotated(facts), facts)
    found = trusting.cue_alignment(U1)
    assert found.judged == len(facts) and found.aligned == 0 and found.trust == 0.0
    assert found.cue_weight == pytest.approx(TRUST_FLOOR) and found.weight(facts[0].id) == found.cue_weight
    assert found.to_dict()["cue_weight"] == round(TRUST_FLOOR, 3)
    hits = trusting.search_batch([probe], scope=U1, params=params)[0]
    # the blind rule lifts the neighbour that holds the target's cues to second, ahead of every other fact
    assert [h.fact.id for h in blind_hits[:2]] == [target.id, neighbour.id]
    # at the floor the target still comes first, found by its own text, and the neighbour is not lifted
    assert hits[0].fact.id == target.id and hits[0].cue is None
    ids = [h.fact.id for h in hits]
    assert neighbour.id not in ids[:2]
    lead = {h.fact.id: h.score for h in hits}
    blind_lead = {h.fact.id: h.score for h in blind_hits}
    assert lead[target.id] - lead.get(neighbour.id, -1.0) > blind_lead[target.id] - blind_lead[neighbour.id]


def test_at_a_floor_of_zero_mixed_up_cues_drop_out_and_the_cue_index_is_not_searched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cue_trust, "TRUST_FLOOR", 0.0)
    facts, target, neighbour, probe, params = mixed_up()
    trusting, inner = wrapped()
    trusting.put_cues(rotated(facts), facts)
    assert trusting.cue_alignment(U1).cue_weight == 0.0
    calls: list[int] = []
    searched = trusting.cues._checked_search

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return searched(*args, **kwargs)

    trusting.cues._checked_search = spy  # type: ignore[method-assign]
    trusting.cues.get_many = lambda *a, **k: calls.append(2) or {}  # type: ignore[method-assign]
    trusted = [h.fact.id for h in trusting.search_batch([probe], scope=U1, params=params)[0]]
    assert calls == []  # the cue index is not read for a scope whose cues weigh nothing
    # the ranking is the facts' own: what a store with no cues at all gives
    uncued = Anticipating(inner, scoring="centred", cues=InMemoryStore(embedder=HashingEmbedder(dim=1024)))
    assert trusted == [h.fact.id for h in uncued.search_batch([probe], scope=U1, params=params)[0]]
    assert trusted[0] == target.id and neighbour.id not in trusted


def test_trust_is_judged_per_scope_and_rejudged_after_a_write() -> None:
    store, _ = wrapped()
    alice, bob = user_facts(U1), user_facts(U2)
    store.put_cues({f.id: own_cues(f) for f in alice}, alice)
    store.put_cues(rotated(bob), bob)
    assert store.cue_alignment(U1).trust == 1.0  # bob's mixed-up cues never reach alice's figure
    assert store.cue_alignment(U2).trust == 0.0
    store.put_cues({f.id: own_cues(f) for f in bob}, bob)  # bob's cues rewritten: his figure is judged again
    assert store.cue_alignment(U2).trust == 1.0
    assert store.cue_alignment(U2).aligned == len(bob)


def test_too_few_cue_sets_to_judge_keep_the_cues_in_full() -> None:
    store, _ = wrapped()
    few = user_facts(U1)[: PER_SESSION * 2]  # two sessions' cue sets, six: fewer than MIN_JUDGED
    store.put_cues({k: v for k, v in rotated(user_facts(U1)).items() if k in {f.id for f in few}}, few)
    found = store.cue_alignment(U1)
    assert found.judged == len(few) < MIN_JUDGED and found.aligned == 0
    assert found.trust == 1.0


def test_the_centred_rule_always_judges_and_the_max_rule_judges_nothing() -> None:
    assert wrapped()[0].judges_cues
    inner = InMemoryStore(embedder=HashingEmbedder())
    inner.add_facts(user_facts(U1))
    store = Anticipating(inner, scoring="max")
    facts = user_facts(U1)
    store.put_cues(rotated(facts), facts)
    assert not store.judges_cues
    assert store.cue_alignment(U1) == Alignment() and store.cue_alignment(U1).trust == 1.0
    with pytest.raises(TypeError, match="cue_trust"):  # trust off lost and was deleted
        Anticipating(InMemoryStore(embedder=HashingEmbedder()), cue_trust=False)  # type: ignore[call-arg]


def test_an_edge_store_and_its_cue_index_are_judged_from_their_own_vectors(tmp_path: Path) -> None:
    from pgr_core import EdgeStore

    facts = user_facts(U1)
    with EdgeStore.open(tmp_path / "s", embedder=HashingEmbedder(dim=1024), create=True) as edge:
        edge.add_facts(facts)
        with Anticipating(edge) as store:  # the cue index: <dir>/cues, another EdgeStore
            assert store.judges_cues
            store.put_cues(rotated(facts), facts)
            mixed = store.cue_alignment(U1)
            store.put_cues({f.id: own_cues(f) for f in facts}, facts)
            fixed = store.cue_alignment(U1)
    assert (mixed.judged, mixed.aligned, mixed.trust) == (len(facts), 0, 0.0)
    assert (fixed.judged, fixed.aligned, fixed.trust) == (len(facts), len(facts), 1.0)


def test_a_cue_index_that_fails_a_read_while_judging_leaves_the_cues_in_full_until_it_reads_again() -> None:
    store, _ = wrapped()
    facts = user_facts(U1)
    store.put_cues(rotated(facts), facts)
    real = store.cues.vectors_for

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("disk went away")

    store.cues.vectors_for = broken  # type: ignore[method-assign]
    assert store.cue_alignment(U1) == Alignment()  # not judged, never raised: the cues count in full
    store.cues.vectors_for = real  # type: ignore[method-assign]
    assert store.cue_alignment(U1).trust == 0.0  # a failed judgement is not kept: judged again once it reads


def test_a_fact_alone_in_its_session_keeps_its_cue_term_when_its_users_cues_are_mixed_up() -> None:
    """PrefEval's shape: the stated preference alone in its session, long filler sessions whose cues
    read as their neighbours'. The fillers' cue term drops out; the preference's was written with no
    other fact beside it, so it counts in full."""
    store, _ = wrapped()
    facts = user_facts(U1)
    alone = Fact(id="u1-alone", text="I never fly overnight", scope=U1, session_id="s-alone", position=0)
    store.store.add_facts([alone])
    cue = "booking a red-eye to the coast"
    store.put_cues({**rotated(facts), alone.id: [cue, "a late departure home"]}, [*facts, alone])
    found = store.cue_alignment(U1)
    assert found.trust == 0.0 and found.lone == frozenset({alone.id})
    assert found.weight(alone.id) == 1.0 and found.weight(facts[0].id) == pytest.approx(TRUST_FLOOR)
    assert found.to_dict()["lone_facts"] == 1
    hits = store.search_batch([cue], scope=U1, params=SearchParams(top_k=5, min_score=0.0))[0]
    assert hits[0].fact.id == alone.id and hits[0].cue == cue  # found through its own cue
    # the fillers' mixed-up cues count at the floor only: a neighbour holding a filler's cues is not lifted
    target, neighbour = facts[2 * PER_SESSION], facts[3 * PER_SESSION - 1]
    ids = [
        h.fact.id
        for h in store.search_batch([own_cues(target)[0]], scope=U1, params=SearchParams(top_k=5, min_score=0.0))[0]
    ]
    assert ids[0] == target.id and neighbour.id not in ids[:2]
