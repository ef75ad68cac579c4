"""Memory guideline induction (MemCoE's MGI): improve the guideline S from training examples.

Memory evolves as M(t+1) = T(M(t), h(t); S): T is :class:`~pgr_core.write.Ingestor` with an LLM,
h(t) the example's sessions one by one, S the guideline. One induction step, in the order it runs:

1. **roll out**: for each training example of a batch, build the memory under S and answer the
   question from it (query-only or PGR retrieval over the built memory, then an answer prompt),
   ``rollouts`` times (the first greedy, the others sampled);
2. **judge**: multiple choice by the chosen letter; free answers by containment, else an LLM judge;
3. **critique** (the textual gradient): contrast every wrong rollout of an example with a right one of
   the same example and say what S should make the writer keep or phrase differently; an example with
   no right rollout teaches nothing (there is nothing to contrast it with), so no edit comes from it;
4. **aggregate** the batch's critiques into a few changes;
5. **edit** S into ``candidates`` new versions; a version that lost a placeholder is refused;
6. **select**: score each candidate on the held-out split and keep the best S seen so far.

Every version is written to ``out_dir/S_vNNN.md`` and every step to ``out_dir/history.json``. An
outage of the judge or the critic (its LLM failed) is recorded in that step's ``outages``: it is
neither a verdict on the rollout nor a reason to say there was nothing wrong.
"""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pgr_core.errors import LLMError
from pgr_core.models.embedders import Embedder, HashingEmbedder
from pgr_core.models.llm import LLM, CallFlow, Request, WrappedLLM, parse_json
from pgr_core.models.prompts import render
from pgr_core.stores.memory import InMemoryStore
from pgr_core.types import Fact, Scope
from pgr_core.write.examples import TrainingExample
from pgr_core.write.guideline import DEFAULT_GUIDELINE, Guideline, GuidelineError
from pgr_core.write.ingest import Ingestor

__all__ = [
    "Contrast",
    "InductionConfig",
    "InductionResult",
    "Trajectory",
    "aggregate",
    "contrast",
    "critique",
    "edit",
    "evaluate",
    "induce",
    "rollout",
]

ANSWER_SCHEMA = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string"}}}
JUDGE_SCHEMA = {"type": "object", "required": ["correct"], "properties": {"correct": {"type": "boolean"}}}
CRITIQUE_SCHEMA = {"type": "object", "required": ["critique"], "properties": {"critique": {"type": "string"}}}
CHANGES_SCHEMA = {
    "type": "object",
    "required": ["changes"],
    "properties": {"changes": {"type": "array", "items": {"type": "string"}}},
}
EDIT_SCHEMA = {"type": "object", "required": ["guideline"], "properties": {"guideline": {"type": "string"}}}


@dataclass(frozen=True)
class InductionConfig:
    """- ``steps``: induction steps; ``batch_size``: training examples per step.
    - ``candidates``: edited versions of S tried per step; ``rollouts``: per training example.
    - ``retrieval``: ``query-only`` or ``pgr`` (LLM prospection) over the built memory;
      the answerer gets the head of each one's ranked list that fits in ``context_tokens`` (1500,
      the answer prompt's budget in :class:`~pgr_core.PGRConfig`), at most ``top_k`` facts (None: no
      cap), so every retrieval is compared at the same context size.
    - ``temperature``: for the sampled rollouts and candidates (the first of each is greedy).
    """

    steps: int = 2
    batch_size: int = 4
    candidates: int = 1
    rollouts: int = 2
    retrieval: str = "query-only"
    top_k: int | None = None
    context_tokens: int = 1500
    temperature: float = 0.7
    seed: int = 0
    max_tokens: int = 800

    def __post_init__(self) -> None:
        if self.retrieval not in ("query-only", "pgr"):
            raise GuidelineError(f"retrieval must be query-only or pgr, got {self.retrieval!r}")
        cap = 1 if self.top_k is None else self.top_k
        if min(self.steps, self.batch_size, self.candidates, self.rollouts, cap, self.context_tokens) < 1:
            raise GuidelineError("steps, batch_size, candidates, rollouts, context_tokens and top_k must be >= 1")


@dataclass
class Trajectory:
    """One rollout: the memory S produced, what the answerer saw, its answer, and the verdict."""

    example: str
    version: int
    memory: list[str]
    retrieved: list[str]
    answer: str
    correct: bool
    raw_fallback: bool = False
    error: str | None = None
    judged: bool = True  # False when the judge's LLM failed: no verdict, so neither right nor wrong

    @property
    def wrong(self) -> bool:
        return self.judged and not self.correct

    def describe(self, limit: int = 12) -> str:
        memory = "\n".join(f"  - {m}" for m in self.memory[:limit]) or "  (nothing)"
        return f"Memory written:\n{memory}\nAnswer given: {self.answer or '(none)'}"


@dataclass
class InductionResult:
    best: Guideline
    best_score: float
    history: list[dict[str, Any]]
    best_path: Path | None = None
    history_path: Path | None = None
    versions: list[Guideline] = field(default_factory=list)


class _Counting(WrappedLLM):
    """Counts the calls made through it (the history reports LLM calls per step)."""

    def __init__(self, inner: LLM) -> None:
        super().__init__(inner)
        self.calls = 0

    def _call(self, request: Request) -> CallFlow:
        self.calls += 1
        return (yield request)


# ====================================================================== 1. roll out


def build_memory(
    example: TrainingExample,
    guideline: Guideline,
    llm: LLM,
    embedder: Embedder,
    *,
    temperature: float = 0.0,
    max_tokens: int = 800,
) -> tuple[InMemoryStore, Scope, bool]:
    """M(t+1) = T(M(t), h(t); S) over the example's sessions. Returns (memory, scope, fell back to raw)."""
    store = InMemoryStore(embedder=embedder)
    scope = Scope(user_id=f"example:{example.id}")
    ingestor = Ingestor(
        store, llm, guideline=guideline, consolidate_every=None, temperature=temperature, max_tokens=max_tokens
    )
    report = ingestor.ingest(example.sessions, scope=scope)
    return store, scope, bool(report.raw_fallback or report.failed)


def retrieve_for(
    store: InMemoryStore, scope: Scope, example: TrainingExample, llm: LLM, config: InductionConfig
) -> list[Fact]:
    from pgr_core.policy.pgr import PGR

    if config.retrieval == "query-only":  # deep enough to fill the same context as the others
        result = PGR(store).query_only(example.question, scope=scope, date=example.date, top_k=100)
    else:
        result = PGR(store, llm=llm, strategy="tot").retrieve(example.question, scope=scope, date=example.date)
    facts = [f.fact for f in result.within_tokens(config.context_tokens)]
    return facts[: config.top_k] if config.top_k is not None else facts


def _fact_line(fact: Fact) -> str:
    when = fact.date.date().isoformat() if fact.date else "undated"
    return f"[{fact.type or 'untyped'}, {when}] {fact.text}"


def answer_question(example: TrainingExample, facts: Sequence[Fact], llm: LLM, *, temperature: float = 0.0) -> str:
    """The answer from the retrieved facts: an option letter for multiple choice, else a short reply."""
    memories = "\n".join(f"- {_fact_line(f)}" for f in facts) or "(nothing remembered)"
    if example.options:
        content = render("write_choose", memories=memories, question=example.question, options=example.options_block())
    else:
        content = render("write_answer", memories=memories, question=example.question)
    completion = llm.complete(
        [{"role": "user", "content": content}], schema=ANSWER_SCHEMA, max_tokens=200, temperature=temperature
    )
    return str(parse_json(completion.text, ANSWER_SCHEMA)["answer"]).strip()


def chosen_letter(answer: str, n_options: int) -> str | None:
    """The option letter in an answer ("B", "B.", "Option B", or the option's own text is not read)."""
    letters = string.ascii_uppercase[:n_options]
    m = re.match(rf"^\W*(?:option\s+)?([{letters}])\b", answer.strip(), re.IGNORECASE)
    return m.group(1).upper() if m else None


# ====================================================================== 2. judge


def _normal(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def judge(example: TrainingExample, answer: str, llm: LLM | None) -> bool:
    """Multiple choice: the chosen letter is the gold one. Free answers: the gold is contained in the
    answer (normalised), else the LLM judge decides (no judge: wrong). Raises LLMError when the judge's
    LLM fails: an outage is no verdict."""
    if example.options:
        return chosen_letter(answer, len(example.options)) == example.gold_letter
    gold = _normal(example.answer)
    if gold and gold in _normal(answer):
        return True
    if llm is None or not answer:
        return False
    content = render("write_judge", question=example.question, gold=example.answer, answer=answer)
    reply = parse_json(
        llm.complete([{"role": "user", "content": content}], schema=JUDGE_SCHEMA, max_tokens=30).text, JUDGE_SCHEMA
    )
    return reply["correct"] is True


def rollout(
    example: TrainingExample,
    guideline: Guideline,
    llm: LLM,
    *,
    config: InductionConfig = InductionConfig(),
    embedder: Embedder | None = None,
    temperature: float = 0.0,
) -> Trajectory:
    """Build the memory under S, answer from it, judge. LLM failures make a wrong trajectory, not an error,
    except the judge's: that one leaves the trajectory unjudged (``judged=False``, the failure in ``error``)."""
    store, scope, fell_back = build_memory(
        example, guideline, llm, embedder or HashingEmbedder(), temperature=temperature, max_tokens=config.max_tokens
    )
    memory = [_fact_line(f) for f in store.facts]
    try:
        facts = retrieve_for(store, scope, example, llm, config)
        answer = answer_question(example, facts, llm, temperature=temperature)
    except LLMError as exc:
        return Trajectory(
            example.id, guideline.version, memory, [], "", False, fell_back, f"{type(exc).__name__}: {exc}"
        )
    retrieved = [_fact_line(f) for f in facts]
    try:
        correct, error = judge(example, answer, llm), None
    except LLMError as exc:  # the judge's outage: no verdict
        correct, error = False, f"{type(exc).__name__}: {exc}"
    return Trajectory(
        example.id, guideline.version, memory, retrieved, answer, correct, fell_back, error, judged=error is None
    )


def evaluate(
    guideline: Guideline,
    examples: Sequence[TrainingExample],
    llm: LLM,
    *,
    config: InductionConfig = InductionConfig(),
    embedder: Embedder | None = None,
) -> tuple[float, list[Trajectory]]:
    """Accuracy of S on ``examples`` (one greedy rollout each)."""
    trajectories = [rollout(e, guideline, llm, config=config, embedder=embedder) for e in examples]
    score = sum(t.correct for t in trajectories) / len(trajectories) if trajectories else 0.0
    return score, trajectories


# ====================================================================== 3-5. critique, aggregate, edit


def _gold_text(example: TrainingExample) -> str:
    return f"{example.gold_letter}. {example.answer}" if example.options else example.answer


def critique(
    example: TrainingExample, guideline: Guideline, wrong: Trajectory, right: Trajectory, llm: LLM
) -> str | None:
    """The textual gradient of one wrong run, contrasted with a right run of the same example: what S
    should change so the wrong run would go right. None when the critic has nothing to say; raises
    LLMError when the critic's LLM fails (:func:`induce` records it as an outage)."""
    question = example.question + (f"\nOptions:\n{example.options_block()}" if example.options else "")
    content = render(
        "write_critique",
        guideline=guideline.text.strip(),
        question=question,
        gold=_gold_text(example),
        correct=f"A run that went right:\n{right.describe()}",
        wrong=f"A run that went wrong:\n{wrong.describe()}",
    )
    reply = parse_json(
        llm.complete([{"role": "user", "content": content}], schema=CRITIQUE_SCHEMA, max_tokens=300).text,
        CRITIQUE_SCHEMA,
    )
    text = " ".join(str(reply["critique"]).split())
    return text or None


@dataclass
class Contrast:
    """What one batch's critique step produced: the critiques, the examples left out for having no right
    rollout, and the judge and critic outages (each ``"<who> (<where>): <error>"``)."""

    critiques: list[str] = field(default_factory=list)
    no_correct_rollout: list[str] = field(default_factory=list)
    outages: list[str] = field(default_factory=list)
    wrong: int = 0  # wrong rollouts seen

    def nothing_learned(self) -> str:
        """Why no edit follows, when no critique came out (an outage is never "no wrong rollout")."""
        if self.outages:
            return f"no usable critique: {len(self.outages)} outage(s) of the judge or critic LLM (see outages)"
        if self.no_correct_rollout:
            return "no example with a wrong rollout had a right one to contrast it with"
        if self.wrong:
            return "the critic found nothing to change"
        return "no wrong rollout on this batch"


def _judge_outages(trajectories: Sequence[Trajectory], where: str) -> list[str]:
    """The judge outages among ``trajectories`` (one rollout per example, e.g. the validation split's)."""
    return [f"judge ({where} {t.example}): {t.error}" for t in trajectories if not t.judged]


def contrast(runs: Sequence[tuple[TrainingExample, Sequence[Trajectory]]], guideline: Guideline, llm: LLM) -> Contrast:
    """Critique every wrong rollout against a right rollout of the same example (taking the right ones
    in turn); an example without a right rollout is left out, so no edit comes from it."""
    out = Contrast()
    for example, trajectories in runs:
        numbered = list(enumerate(trajectories, 1))
        out.outages += [f"judge ({example.id} rollout {r}): {t.error}" for r, t in numbered if not t.judged]
        right = [t for _, t in numbered if t.judged and t.correct]
        wrong = [(r, t) for r, t in numbered if t.wrong]
        out.wrong += len(wrong)
        if wrong and not right:
            out.no_correct_rollout.append(example.id)
            continue
        for i, (r, t) in enumerate(wrong):
            try:
                text = critique(example, guideline, t, right[i % len(right)], llm)
            except LLMError as exc:
                out.outages.append(f"critic ({example.id} rollout {r}): {type(exc).__name__}: {exc}")
                continue
            if text:
                out.critiques.append(text)
    return out


def aggregate(critiques: Sequence[str], llm: LLM) -> list[str]:
    """The batch's critiques as a few changes to S (a single critique is its own change)."""
    if len(critiques) <= 1:
        return list(critiques)
    numbered = "\n".join(f"{i}. {c}" for i, c in enumerate(critiques, 1))
    try:
        reply = parse_json(
            llm.complete(
                [{"role": "user", "content": render("write_aggregate", critiques=numbered)}],
                schema=CHANGES_SCHEMA,
                max_tokens=400,
            ).text,
            CHANGES_SCHEMA,
        )
    except LLMError:
        return list(critiques)[:5]
    changes = [" ".join(str(c).split()) for c in reply["changes"] if str(c).strip()]
    return changes[:5] or list(critiques)[:5]


def edit(
    guideline: Guideline, changes: Sequence[str], llm: LLM, *, temperature: float = 0.0, max_tokens: int = 900
) -> Guideline:
    """A new version of S with ``changes`` made. Raises :class:`GuidelineError` when the edit dropped a
    placeholder or is unusable, and LLMError when the LLM fails."""
    content = render(
        "write_edit",
        guideline=guideline.text.strip(),
        changes="\n".join(f"- {c}" for c in changes),
        placeholders=", ".join("{" + p + "}" for p in guideline.placeholders),
    )
    completion = llm.complete(
        [{"role": "user", "content": content}], schema=EDIT_SCHEMA, max_tokens=max_tokens, temperature=temperature
    )
    if completion.truncated:
        raise GuidelineError("the edited guideline was cut off at the token limit")
    text = str(parse_json(completion.text, EDIT_SCHEMA)["guideline"])
    return guideline.edited(text, note="; ".join(changes))


# ====================================================================== the loop


def induce(
    train: Sequence[TrainingExample],
    val: Sequence[TrainingExample],
    *,
    llm: LLM,
    guideline: Guideline = DEFAULT_GUIDELINE,
    config: InductionConfig = InductionConfig(),
    out_dir: str | Path | None = None,
    embedder: Embedder | None = None,
    log: Callable[[str], None] | None = None,
) -> InductionResult:
    """Run guideline induction; returns the best S on ``val`` and the history of every step.

    >>> result = induce(train, val, llm=llm, config=InductionConfig(steps=2), out_dir="runs/mgi")  # doctest: +SKIP
    >>> print(result.best.text, result.best_score)  # doctest: +SKIP
    """
    if not train or not val:
        raise GuidelineError("induction needs training and validation examples (both splits non-empty)")
    say = log or (lambda _m: None)
    counted = _Counting(llm)
    rng = random.Random(config.seed)
    folder = Path(out_dir) if out_dir is not None else None
    embedder = embedder or HashingEmbedder()
    next_version = guideline.version + 1

    best = guideline
    best_score, checked = evaluate(best, val, counted, config=config, embedder=embedder)
    versions = [best]
    history: list[dict[str, Any]] = [
        {
            "step": 0,
            "version": best.version,
            "parent": None,
            "val_score": best_score,
            "train_score": None,
            "accepted": True,
            "reason": "the starting guideline",
            "outages": _judge_outages(checked, "validation"),
            "llm_calls": counted.calls,
            "id": best.id,
        }
    ]
    say(f"step 0: S v{best.version} scores {best_score:.3f} on {len(val)} validation examples")
    _save(folder, best, history)

    for step in range(1, config.steps + 1):
        calls_before = counted.calls
        batch = rng.sample(list(train), min(config.batch_size, len(train)))
        # 1-2. roll out and judge
        runs: list[tuple[TrainingExample, list[Trajectory]]] = []
        for example in batch:
            runs.append(
                (
                    example,
                    [
                        rollout(
                            example,
                            best,
                            counted,
                            config=config,
                            embedder=embedder,
                            temperature=0.0 if r == 0 else config.temperature,
                        )
                        for r in range(config.rollouts)
                    ],
                )
            )
        trajectories = [t for _, ts in runs for t in ts]
        train_score = sum(t.correct for t in trajectories) / len(trajectories)
        # 3. critique every wrong run against a right run of the same example
        found = contrast(runs, best, counted)
        critiques = found.critiques
        row: dict[str, Any] = {
            "step": step,
            "train_score": train_score,
            "critiques": critiques,
            "no_correct_rollout": found.no_correct_rollout,
            "outages": found.outages,
        }
        if not critiques:
            reason = found.nothing_learned()
            history.append(
                {
                    **row,
                    "version": best.version,
                    "val_score": best_score,
                    "accepted": False,
                    "reason": reason,
                    "llm_calls": counted.calls - calls_before,
                }
            )
            say(f"step {step}: nothing to learn from this batch (train {train_score:.3f}): {reason}")
            _save(folder, best, history)
            continue
        # 4. aggregate, 5. edit
        changes = aggregate(critiques, counted)
        row["changes"] = changes
        scored: list[tuple[float, Guideline]] = []
        for c in range(config.candidates):
            try:
                candidate = edit(best, changes, counted, temperature=0.0 if c == 0 else config.temperature)
            except (GuidelineError, LLMError) as exc:
                history.append(
                    {
                        **row,
                        "version": None,
                        "parent": best.version,
                        "val_score": None,
                        "accepted": False,
                        "reason": f"edit refused: {exc}",
                        "llm_calls": counted.calls - calls_before,
                    }
                )
                say(f"step {step}: candidate {c + 1} refused ({exc})")
                continue
            candidate = replace(candidate, version=next_version, parent=best.version)
            next_version += 1
            versions.append(candidate)
            # 6. score on the held-out split
            score, checked = evaluate(candidate, val, counted, config=config, embedder=embedder)
            scored.append((score, candidate))
            history.append(
                {
                    **row,
                    "outages": row["outages"] + _judge_outages(checked, "validation"),
                    "version": candidate.version,
                    "parent": best.version,
                    "val_score": score,
                    "accepted": False,
                    "id": candidate.id,
                    "llm_calls": counted.calls - calls_before,
                }
            )
            say(f"step {step}: S v{candidate.version} scores {score:.3f} (best so far {best_score:.3f})")
            _save(folder, candidate, None)
        if scored:
            score, candidate = max(scored, key=lambda pair: pair[0])
            if score > best_score:
                best, best_score = candidate, score
            for h in history:
                if h["step"] != step or h.get("version") is None:
                    continue
                h["accepted"] = h["version"] == best.version
                h["reason"] = (
                    "best on the validation split so far"
                    if h["accepted"]
                    else f"not better than S v{best.version} ({best_score:.3f})"
                )
        _save(folder, best, history)

    best_path = folder / "best.md" if folder is not None else None
    history_path = folder / "history.json" if folder is not None else None
    return InductionResult(best, best_score, history, best_path, history_path, versions)


def _save(folder: Path | None, guideline: Guideline, history: list[dict[str, Any]] | None) -> None:
    if folder is None:
        return
    guideline.save(folder)
    if history is not None:
        (folder / "best.md").write_text(guideline.text, encoding="utf-8")
        payload = {"best_version": guideline.version, "best_id": guideline.id, "steps": history}
        (folder / "history.json").write_text(json.dumps(payload, indent=1, ensure_ascii=False), encoding="utf-8")
