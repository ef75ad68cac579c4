"""Other ways to score a fact by its cues, against the one ``Anticipating`` uses, at the same number of
facts. No LLM call: the cues come from a cue cache a build filled (``pgr eval --cues`` or ``pgr cues
build``), the vectors from the vector cache.

    python benchmarks/cue_scoring.py --data ../shared/data/mq-lite/dev-facts.jsonl \
        --cue-cache .pgr-cache/cues.sqlite3 --model qwen [--vector-cache .pgr-cache/vectors] [--json out.json]
    python benchmarks/cue_scoring.py --set locomo --data ../shared/data/locomo --user conv-30 --cue-cache ...
    python benchmarks/cue_scoring.py ... --max-cues 1     # each fact's first cue only
    python benchmarks/cue_scoring.py ... --floor 0.1 --floor 0.3   # other cue-trust floors beside the library's
    python benchmarks/cue_scoring.py ... --writer "qwen|cues-3c11e68363c3|4"   # an earlier prompt's build

For each question with gold, every fact of its user is scored against the question alone (MiniLM
cosines, no floor, so the figures are those of query-only at K = 20 and of ``Anticipating``'s rule),
ranked, and recall@10 / recall@20 averaged. The rules:

- ``own``: the fact's text alone (plain query-only);
- ``max(own, w*best)``: ``Anticipating``'s rule, the fact's best cue weighted by w;
- ``own + w*best``, ``max(own, w*mean of top 2)``: sums and means instead of the max;
- ``own + mean of the best 2 cues, centred`` and the rows beside it: a fact's cue term pooled over
  several of its cues (a single stray cue counts for less), against the best cue alone;
- ``expanded``: the fact's text and its cues embedded together as one text (document expansion);
- ``cues joined``, ``cue centroid``: the cues alone, as one text or as the mean of their vectors;
- ``rrf(own, best)`` and ``rrf(own, best, expanded)``: reciprocal-rank fusion (k = 60) of the lists;
- ``the cues' excess typicality taken off``: the max rule with each cue less how much more typical
  it is than the user's cues on average (the fact's own cosine left as it is);
- ``own + trust*best``: ``Anticipating``'s default: the user's cue trust (``pgr_core.cue_trust``) weights
  the cue term (``max(TRUST_FLOOR, trust)``), in full for a fact alone in its session, and the
  sum is scaled to two terms' worth; "no floor" is the rule before, the cue term dropped at trust 0;
- ``centred``: each similarity less its typicality (pgr's centring, ``pgr_core.centring``): a fact's
  text less its cosine to the mean of its user's fact vectors, a cue less its cosine to the mean of its
  user's cue vectors; ``max(own, w*best), centred`` is ``Anticipating``'s rule over centred scores.

- ``nearest (pf, pc)``: ``Anticipating``'s default since the nearest-share rule
  (``pgr_core.anticipating.NEAREST``): a fact's typicality is its mean cosine to its nearest ``pf``
  share of the user's other facts, a cue's to its nearest ``pc`` share of the cues of the user's other
  facts, instead of the cosine to the whole mean. ``--nearest-grid`` scores a grid of shares and, for
  each user in turn, the share the other users' questions pick (leave one user out), against the
  rule before, with the questions each moved up or down.

- the last four rows use the same cues beside their session, centred and summed: cues too close to
  their own fact's text dropped; a fact whose cue set reads as another fact's given a smaller cue
  weight (``2 / (1 + w) x (own + w x cue)``); each cue credited to the fact of its session nearest it as
  well as to its own; cues filed under two or more facts of one session dropped.

A fact the cache has no cues for is scored by its text alone in every rule. It also counts the cue sets
that read as another fact's: the mean of a fact's cue vectors closer to another fact of its session
than to its own (the cue writer asks about a whole session at once). ``--max-cues N`` keeps
each fact's first N cues: what asking for fewer would give, if the model writes its best first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pgr_core import CueCache, CueWriter, MiniLMEmbedder
from pgr_core.anticipating import NEAREST
from pgr_core.centring import nearest_means
from pgr_core.cue_trust import alignment, session_of
from pgr_core.cues import DEFAULT_CUES
from pgr_core.evaluation import load_set
from pgr_core.evaluation.cache import disk_cached_embedder
from pgr_core.evaluation.metrics import recall_at

NEAR_OWN = 0.6  # a cue this close (cosine) to its own fact's text reads as the fact restated
MISFILED_WEIGHT = 0.3  # the cue term of a fact whose cue set reads as another fact's


def _unit(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def _ranks(scores: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(-scores))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--set", default="jsonl", choices=("jsonl", "locomo"), help="the data set's format (jsonl)")
    p.add_argument("--user", action="append", default=[], help="only this user's facts and questions")
    p.add_argument("--cue-cache", type=Path, required=True)
    p.add_argument("--model", default="qwen", help="the model name the cues were cached under")
    p.add_argument("--vector-cache", type=Path, default=Path(".pgr-cache/vectors"))
    p.add_argument("--json", type=Path, default=None)
    p.add_argument(
        "--max-cues", type=int, default=None, help="keep only each fact's first N cues (what fewer cues would give)"
    )
    p.add_argument(
        "--floor",
        type=float,
        action="append",
        default=[],
        help="also score with the cue term weighted max(F, trust) (the library's floor F is TRUST_FLOOR)",
    )
    p.add_argument("--cues-per-fact", type=int, default=DEFAULT_CUES, help="the build to read: cues asked per fact")
    p.add_argument(
        "--nearest-grid",
        action="store_true",
        help="also score nearest-share typicality over a grid of (fact, cue) shares; pick one leaving each user out",
    )
    p.add_argument(
        "--writer",
        default=None,
        help="the cache key to read cues under, as CueWriter.identity (model|cues-<prompt digest>|count): "
        "a build by an earlier prompt (default: this prompt's, from --model and --cues-per-fact)",
    )
    args = p.parse_args()
    data = load_set(args.set, args.data)
    if args.user:
        data = data.select(users=args.user)
    embedder = disk_cached_embedder(MiniLMEmbedder(), args.vector_cache)
    got = CueCache(args.cue_cache).get_many(
        args.writer or CueWriter.identity_for(args.model, args.cues_per_fact), [f.text for f in data.facts]
    )
    facts = data.facts
    cues = [list(got.get(f.text, ()))[: args.max_cues] for f in facts]
    print(f"{len(facts)} facts, {sum(1 for c in cues if c)} with cues in the cache", file=sys.stderr)
    own_v = _unit(np.asarray(embedder.embed([f.text for f in facts]), dtype=np.float32))
    texts = sorted({c for cs in cues for c in cs})
    cue_v = dict(zip(texts, _unit(np.asarray(embedder.embed(texts), dtype=np.float32)), strict=True))
    pairs = list(zip(facts, cues, strict=True))
    expanded_v = _unit(np.asarray(embedder.embed([" ".join([f.text, *cs]) for f, cs in pairs])))
    joined_v = _unit(np.asarray(embedder.embed([" ".join(cs) if cs else f.text for f, cs in pairs])))
    centroid_v = _unit(np.stack([np.mean([cue_v[c] for c in cs], 0) if cs else own_v[i] for i, cs in enumerate(cues)]))

    centres: dict[object, tuple[np.ndarray, np.ndarray]] = {}  # scope -> mean fact vector, mean cue vector
    cue_typical: dict[object, float] = {}  # scope -> its cues' mean typicality
    for scope in {f.scope for f in facts}:
        mine = [i for i, f in enumerate(facts) if f.scope == scope]
        mine_cues = [cue_v[c] for i in mine for c in cues[i]]
        cue_mean = np.mean(mine_cues, 0) if mine_cues else own_v[mine].mean(0)
        centres[scope] = (own_v[mine].mean(0), cue_mean)
        cue_typical[scope] = float(np.mean([v @ cue_mean for v in mine_cues])) if mine_cues else 0.0

    # nearest-share typicality (MemoryCentre(nearest=p)): a fact's mean cosine to its nearest share of
    # the user's other facts, a cue's to its nearest share of the cues of the user's other facts
    fact_shares = [0.1, 0.2, 0.3, 0.5, 0.7, 1.0] if args.nearest_grid else [NEAREST[0]]
    cue_shares = [0.05, 0.1, 0.2, 0.3, 0.5, 1.0] if args.nearest_grid else [NEAREST[1]]
    near_fact: dict[float, np.ndarray] = {pf: np.zeros(len(facts)) for pf in fact_shares}
    near_cue: dict[float, dict[tuple[int, str], float]] = {pc: {} for pc in cue_shares}

    for user_scope in {f.scope for f in facts}:
        mine = [i for i, f in enumerate(facts) if f.scope == user_scope]
        sims = own_v[mine] @ own_v[mine].T
        np.fill_diagonal(sims, -np.inf)
        for pf, row in nearest_means(sims, fact_shares).items():
            near_fact[pf][mine] = row
        items = [(i, c) for i in mine for c in cues[i]]
        if items:
            owner = np.array([i for i, _ in items])
            block = np.stack([cue_v[c] for _, c in items])
            sims = block @ block.T
            sims[owner[:, None] == owner[None, :]] = -np.inf  # a cue's siblings (and itself) left out
            for pc, row in nearest_means(sims, cue_shares).items():
                near_cue[pc].update(zip(items, map(float, row), strict=True))

    def nearest_terms(
        q: np.ndarray, idx: list[int], own: np.ndarray, pf: float, pc: float
    ) -> tuple[np.ndarray, np.ndarray]:
        own_n = own - near_fact[pf][idx]
        best_n = np.array(
            [
                max(float(cue_v[c] @ q) - near_cue[pc][(i, c)] for c in cues[i]) if cues[i] else own_n[j]
                for j, i in enumerate(idx)
            ]
        )
        return own_n, best_n

    def rules(q: np.ndarray, idx: list[int]) -> dict[str, np.ndarray]:
        own = own_v[idx] @ q
        per_fact = [
            np.array([cue_v[c] @ q for c in cues[i]]) if cues[i] else np.array([own[j]]) for j, i in enumerate(idx)
        ]
        best = np.array([c.max() for c in per_fact])
        fact_mean, cue_mean = centres[facts[idx[0]].scope]
        typ_own = own_v[idx] @ fact_mean
        own_c = own - typ_own
        centred_cue = lambda c: cue_v[c] @ q - cue_v[c] @ cue_mean  # noqa: E731
        # each fact's centred cue terms, best first (a fact without cues: its own term, as its one cue)
        sorted_c = [
            sorted(map(centred_cue, cues[i]), reverse=True) if cues[i] else [own_c[j]] for j, i in enumerate(idx)
        ]
        best_c = np.array([c[0] for c in sorted_c])
        second_c = np.array([c[1] if len(c) > 1 else c[0] for c in sorted_c])
        mean_c = np.array([float(np.mean(c)) for c in sorted_c])
        # the cue side only: a cue less how much more typical it is than the user's cues on average
        cued = np.array([bool(cues[i]) for i in idx])
        best_s = np.where(cued, best_c + cue_typical[facts[idx[0]].scope], own)
        top2 = np.array([np.sort(c)[-2:].mean() for c in per_fact])
        expanded = expanded_v[idx] @ q
        r_own, r_best, r_exp = _ranks(own), _ranks(best), _ranks(expanded)
        return {
            "own (query-only)": own,
            "max(own, 0.9*best) (Anticipating)": np.maximum(own, 0.9 * best),
            "max(own, 1.0*best)": np.maximum(own, best),
            "own + best": own + best,
            "own + 0.5*best": own + 0.5 * best,
            "max(own, 0.9*mean of top 2)": np.maximum(own, 0.9 * top2),
            "expanded (text and cues as one)": expanded,
            "cues joined": joined_v[idx] @ q,
            "cue centroid": centroid_v[idx] @ q,
            "max(own, expanded)": np.maximum(own, expanded),
            "rrf(own, best)": 1 / (60 + r_own) + 1 / (60 + r_best),
            "rrf(own, best, expanded)": 1 / (60 + r_own) + 1 / (60 + r_best) + 1 / (60 + r_exp),
            "own, centred (pgr-none over the plain store)": own_c,
            "max(own, 0.9*best), the fact's typicality taken off": np.maximum(own, 0.9 * best) - typ_own,
            "max(own, 0.9*best), centred": np.maximum(own_c, 0.9 * best_c),
            "max(own, 0.9*best), the cues' excess typicality taken off": np.maximum(own, 0.9 * best_s),
            "max(own, 1.0*best), the cues' excess typicality taken off": np.maximum(own, best_s),
            "max(own, 1.0*best), centred": np.maximum(own_c, best_c),
            "own + best, centred (Anticipating, cue_trust=False)": own_c + best_c,
            "own + trust*best, centred on the whole mean (Anticipating, nearest=None: the rule before)": trusted(
                idx, own_c, best_c
            ),
            f"own + trust*best, nearest {NEAREST} (Anticipating, the default)": trusted(
                idx, *nearest_terms(q, idx, own, *NEAREST)
            ),
            **(
                {
                    f"own + trust*best, nearest ({pf}, {pc})": trusted(idx, *nearest_terms(q, idx, own, pf, pc))
                    for pf in fact_shares
                    for pc in cue_shares
                }
                if args.nearest_grid
                else {}
            ),
            "own + trust*best, centred, no floor (the cue term dropped at trust 0, the rule before)": trusted(
                idx, own_c, best_c, floor=0.0
            ),
            **{f"own + trust*best, centred, floor {f}": trusted(idx, own_c, best_c, floor=f) for f in args.floor},
            "own + 0.75*best, centred": own_c + 0.75 * best_c,
            "own + mean of the best 2 cues, centred": own_c + (best_c + second_c) / 2,
            "own + best + 0.5*second cue, centred": own_c + best_c + 0.5 * second_c,
            "own + best + second cue, centred (scaled to two terms)": 2 / 3 * (own_c + best_c + second_c),
            "own + mean of all cues, centred": own_c + mean_c,
            "own + (best + mean of all cues) / 2, centred": own_c + (best_c + mean_c) / 2,
            "own + 0.5*best, centred": own_c + 0.5 * best_c,
            **variants(idx, own_c, best_c, centred_cue),
        }

    # how often a fact's cues read as another fact's (the mean of its cue vectors closer to another fact
    # of its session than to its own), and each user's cue trust, as Anticipating judges them
    # (pgr_core.cue_trust: sessions grouped as a cue build groups them, facts with no session left out)
    sessions: dict[tuple[object, str], list[int]] = {}
    for i, f in enumerate(facts):
        if session_of(f):
            sessions.setdefault((f.scope, session_of(f)), []).append(i)
    stacked = {i: np.stack([cue_v[c] for c in cs]) for i, cs in enumerate(cues) if cs}
    weight: dict[object, float] = {}  # the cue term's weight (Alignment.cue_weight: the trust, never below the floor)
    judged_trust: dict[object, float] = {}  # the judged trust alone: 0 at chance
    aligned_by_scope: dict[str, dict[str, object]] = {}
    judged = closer_elsewhere = 0
    for scope in centres:
        found = alignment(own_v, [m for (s, _), m in sessions.items() if s == scope], stacked)
        judged += found.judged
        closer_elsewhere += found.judged - found.aligned
        weight[scope] = found.cue_weight
        judged_trust[scope] = found.trust
        aligned_by_scope[str(scope)] = found.to_dict()
    print(f"cue sets closer to another fact of their session than to their own: {closer_elsewhere} of {judged}")
    lone = {m[0] for m in sessions.values() if len(m) == 1}  # alone in its session: its cue term in full

    def trusted(idx: list[int], own_c: np.ndarray, best_c: np.ndarray, floor: float | None = None) -> np.ndarray:
        """Anticipating's rule: 2 / (1 + w) x (own + w x cue), w the user's cue weight (1 for a lone fact)."""
        scope = facts[idx[0]].scope
        t = weight[scope] if floor is None else max(floor, judged_trust[scope])
        w = np.array([1.0 if i in lone else t for i in idx])
        return 2.0 / (1.0 + w) * (own_c + w * best_c)

    # what each cue is beside its session: too close to its own fact's text, filed under two or more
    # facts of the session, or nearer another fact of the session than its own; and each cue set's
    # alignment (cue_trust's rule, per fact)
    session_key = {i: key for key, members in sessions.items() for i in members}
    mates = {i: sessions[session_key[i]] if i in session_key else [i] for i in range(len(facts))}
    filed: dict[tuple[object, str], set[int]] = {}
    for i, cs in enumerate(cues):
        for c in cs:
            filed.setdefault((session_key.get(i, i), c.lower()), set()).add(i)
    near_own = {(i, c) for i, cs in enumerate(cues) for c in cs if float(cue_v[c] @ own_v[i]) > NEAR_OWN}
    shared = {(i, c) for i, cs in enumerate(cues) for c in cs if len(filed[(session_key.get(i, i), c.lower())]) > 1}
    nearest = {(i, c): max(mates[i], key=lambda m: float(own_v[m] @ cue_v[c])) for i, cs in enumerate(cues) for c in cs}
    own_set = {i: max(mates[i], key=lambda m: float(own_v[m] @ stacked[i].mean(0))) == i for i in stacked}

    def variants(
        idx: list[int], own_c: np.ndarray, best_c: np.ndarray, centred_cue: Callable[[str], float]
    ) -> dict[str, np.ndarray]:
        """Other ways to use the same cues beside their session (centred, summed as Anticipating does)."""
        at = {i: j for j, i in enumerate(idx)}

        def best(keep: Callable[[int, str], bool], credit_nearest: bool = False) -> np.ndarray:
            out = own_c.copy()  # a fact left with no cue: its own term, as a fact without cues
            seen = np.zeros(len(idx), dtype=bool)
            for i in idx:
                for c in cues[i]:
                    if not keep(i, c):
                        continue
                    for target in {i, nearest[(i, c)]} if credit_nearest else {i}:
                        j, v = at[target], centred_cue(c)
                        if not seen[j] or v > out[j]:
                            out[j], seen[j] = v, True
            return out

        w = np.array([1.0 if own_set.get(i, True) else MISFILED_WEIGHT for i in idx])
        return {
            f"own + best, centred, cues closer than {NEAR_OWN} to their own fact dropped": own_c
            + best(lambda i, c: (i, c) not in near_own),
            f"own + best, centred, a cue set closer to another fact weighted {MISFILED_WEIGHT}": 2.0
            / (1.0 + w)
            * (own_c + w * best_c),
            "own + best, centred, each cue credited to the session's fact nearest it too": own_c
            + best(lambda i, c: True, credit_nearest=True),
            "own + best, centred, cues filed under two or more facts of a session dropped": own_c
            + best(lambda i, c: (i, c) not in shared),
        }

    for scope, figures in aligned_by_scope.items():
        print(f"  {scope}: {figures}")
    questions = [q for q in data.questions if q.gold]
    vectors = _unit(np.asarray(embedder.embed([q.question for q in questions]), dtype=np.float32))
    out: dict[str, dict[int, list[float]]] = {}
    by_user: dict[str, dict[str, list[float]]] = {}  # rule -> user -> recall@20 per question
    user_of = lambda q: str(q.scope.user_id or q.scope)  # noqa: E731
    for q, qv in zip(questions, vectors, strict=True):
        idx = [i for i, f in enumerate(facts) if f.scope == q.scope]
        for name, scores in rules(qv, idx).items():
            order = [facts[idx[j]].id for j in np.argsort(-scores, kind="stable")]
            for k in (10, 20):
                out.setdefault(name, {}).setdefault(k, []).append(recall_at(order, q.gold, k, missing=q.missing))
            by_user.setdefault(name, {}).setdefault(user_of(q), []).append(out[name][20][-1])
    table: Callable[[str, int], float] = lambda name, k: round(statistics.fmean(out[name][k]), 3)  # noqa: E731
    users = list(dict.fromkeys(map(user_of, questions)))
    per_user = lambda name: [round(statistics.fmean(by_user[name][u]), 3) for u in users]  # noqa: E731
    # a rule that gains on the whole but not user by user gains on a few questions (12 a user on MQ-lite)
    shown = users if 1 < len(users) <= 6 else []
    print(
        f"| rule ({len(questions)} questions) | recall@10 | recall@20 |"
        + "".join(f" {u} @20 |" for u in shown)
        + "\n|---|---|---|"
        + "---|" * len(shown)
    )
    for name in out:
        cells = "".join(f" {v:.3f} |" for v in per_user(name)) if shown else ""
        print(f"| {name} | {table(name, 10):.3f} | {table(name, 20):.3f} |{cells}")
    louo: list[dict[str, object]] = []
    if args.nearest_grid:
        before = "own + trust*best, centred on the whole mean (Anticipating, nearest=None: the rule before)"
        grid = [n for n in out if n.startswith("own + trust*best, nearest (")]
        print(f"\nnearest shares, recall@20 (rows: the facts' share; columns: the cues' share {cue_shares}):")
        for pf in fact_shares:
            print(
                f"  {pf}: "
                + " ".join(f"{table(f'own + trust*best, nearest ({pf}, {pc})', 20):.3f}" for pc in cue_shares)
            )
        users_of = [user_of(q) for q in questions]
        at20 = lambda name, keep: [r for r, u in zip(out[name][20], users_of, strict=True) if keep(u)]  # noqa: E731
        for u in users if len(users) > 1 else []:
            others, held = (lambda x, u=u: x != u), (lambda x, u=u: x == u)
            picked = max(grid, key=lambda n: statistics.fmean(at20(n, others)))
            new, old = at20(picked, held), at20(before, held)
            entry: dict[str, object] = {
                "held_out": u,
                "picked": picked,
                "recall@20": round(statistics.fmean(new), 3),
                "before": round(statistics.fmean(old), 3),
                "up": sum(a > b for a, b in zip(new, old, strict=True)),
                "down": sum(a < b for a, b in zip(new, old, strict=True)),
            }
            louo.append(entry)
            print(
                f"  {u} left out: the others pick {picked!r}: {entry['recall@20']} against {entry['before']} before "
                f"({entry['up']} questions up, {entry['down']} down)"
            )
    if args.json:
        rows = {
            name: {f"recall@{k}": table(name, k) for k in (10, 20)}
            | {"recall@20 by user": dict(zip(users, per_user(name), strict=True))}
            for name in out
        }
        aligned = {"cue_sets_in_shared_sessions": judged, "closer_to_another_fact": closer_elsewhere}
        report = {
            "data": str(args.data),
            "questions": len(questions),
            "alignment": aligned,
            "trust": aligned_by_scope,
            "rules": rows,
            "nearest_left_one_user_out": louo,
        }
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
