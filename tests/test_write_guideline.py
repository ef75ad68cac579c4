"""Guideline induction (MemCoE's MGI) with a scripted LLM: rollouts, judging, critiques contrasting right
and wrong runs, aggregation, edits that must keep their placeholders, selection on a held-out split, and a
history of every step's S and score. Also the PrefEval loader that feeds it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from pgr_core import LLMConnectionError
from pgr_core.cli.main import main
from pgr_core.testing import ScriptedLLM
from pgr_core.write import DEFAULT_GUIDELINE, Session, Turn
from pgr_core.write.examples import TrainingExample, prefeval_examples
from pgr_core.write.induction import (
    InductionConfig,
    Trajectory,
    chosen_letter,
    critique,
    evaluate,
    induce,
    judge,
    rollout,
)

PREFEVAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "prefeval"


def _example(i: int, preference: str, question: str, good: str, bad: Sequence[str]) -> TrainingExample:
    options = (*bad[:1], good, *bad[1:])  # the good option is B
    return TrainingExample(
        id=f"ex{i}",
        sessions=(Session("pref", "2025-01-06", [Turn("user", preference), Turn("assistant", "Noted!")]),),
        question=question,
        answer=good,
        options=options,
        date=datetime(2025, 1, 8),
    )


EXAMPLES = [
    _example(
        0,
        "I avoid hotels with loud nightlife.",
        "Which hotel in Las Vegas?",
        "Vdara, a calm non-gaming hotel",
        ["The Cosmopolitan and its nightclubs", "MGM Grand with casino parties"],
    ),
    _example(
        1, "I am vegetarian.", "What should I cook tonight?", "A lentil curry", ["A rib-eye steak", "Chicken wings"]
    ),
    _example(
        2,
        "I get seasick easily.",
        "How should I spend a day in Sydney?",
        "A walk through the botanic garden",
        ["A sailing trip in the harbour", "A ferry tour to Manly"],
    ),
    _example(
        3,
        "I hate crowds.",
        "Where should I watch the match?",
        "At home with a friend",
        ["In a packed sports bar", "In the stadium's standing section"],
    ),
]
GOOD = {e.question: e.answer for e in EXAMPLES}
BETTER = "KEEP EVERY STATED PREFERENCE, word for word.\nTypes:\n{types}\n"


@dataclass
class SamplingLLM(ScriptedLLM):
    """A ScriptedLLM whose handler can see the temperature of the call it answers."""

    temperature: float = 0.0

    def complete(self, messages: Any, *, schema: Any = None, max_tokens: int = 512, temperature: float = 0.0) -> Any:
        self.temperature = temperature
        return super().complete(messages, schema=schema, max_tokens=max_tokens, temperature=temperature)


def scripted_world(
    edits: list[str],
    *,
    explores: Callable[[str, int], bool] = lambda said, n: True,
    critic: Callable[[str], Any] | None = None,
) -> SamplingLLM:
    """A stand-in LLM whose extraction keeps preferences under the improved guideline, or in a sampled
    rollout when ``explores(said, n)`` (n counts the sampled writes of that statement, from 1), and
    whose answerer picks the right option only when the memory holds the preference."""
    sampled: dict[str, int] = {}

    def handler(messages: Sequence[Mapping[str, str]], schema: Any) -> Any:
        prompt = messages[0]["content"]
        if prompt.startswith("You keep a long-term memory"):
            said = re.search(r"<conversation>\nuser: (.*)\n", prompt).group(1)  # type: ignore[union-attr]
            if "KEEP EVERY STATED PREFERENCE" in prompt:
                return {"facts": [{"text": f"The user said: {said}", "type": "Preference"}]}
            if llm.temperature > 0:
                n = sampled[said] = sampled.get(said, 0) + 1
                if explores(said, n):
                    return {"facts": [{"text": f"The user said: {said} (sampled write {n})", "type": "Preference"}]}
            return {"facts": []}
        if "Which of these replies suits this user best" in prompt:
            question = re.search(r'The user asks: "(.*)"', prompt).group(1)  # type: ignore[union-attr]
            options = re.findall(r"^([A-Z])\. (.*)$", prompt, re.MULTILINE)
            good = next(letter for letter, text in options if text == GOOD[question])
            bad = next(letter for letter, text in options if text != GOOD[question])
            return {"answer": good if "The user said" in prompt else bad}
        if prompt.startswith("You improve the guideline"):
            if critic is not None:
                return critic(prompt)
            return {"critique": "The writer dropped the user's stated preference; keep such statements."}
        if prompt.startswith("Several critiques"):
            return {"changes": ["Keep every preference the user states."]}
        if "Revise it to make these changes" in prompt:
            return {"guideline": edits.pop(0)}
        raise AssertionError(f"unexpected prompt: {prompt[:120]}")

    llm = SamplingLLM(handler=handler)
    return llm


def prompts(llm: ScriptedLLM, start: str) -> list[str]:
    return [c.prompt for c in llm.calls if c.prompt.startswith(start)]


def test_induction_keeps_the_best_guideline_and_records_every_step(tmp_path: Path) -> None:
    llm = scripted_world(["Keep preferences. (the placeholder is gone)", BETTER])
    config = InductionConfig(steps=2, batch_size=2, candidates=2, rollouts=2, seed=1)
    result = induce(EXAMPLES[:2], EXAMPLES[2:], llm=llm, config=config, out_dir=tmp_path)

    assert result.best.version == 1 and "KEEP EVERY STATED PREFERENCE" in result.best.text
    assert result.best_score == 1.0
    steps = result.history
    assert steps[0] == {**steps[0], "step": 0, "version": 0, "val_score": 0.0, "accepted": True}
    refused = [h for h in steps if h["step"] == 1 and h["version"] is None]
    assert len(refused) == 1 and "{types}" in refused[0]["reason"]  # the edit that lost {types} never ran
    kept = [h for h in steps if h["step"] == 1 and h["version"] == 1]
    # greedy rollouts kept nothing and went wrong; the sampled ones kept the preference and went right
    assert kept and kept[0]["accepted"] and kept[0]["val_score"] == 1.0 and kept[0]["train_score"] == 0.5
    assert len(kept[0]["critiques"]) == 2 and kept[0]["changes"] == ["Keep every preference the user states."]
    assert kept[0]["no_correct_rollout"] == [] and kept[0]["outages"] == []
    last = steps[-1]
    assert last["step"] == 2 and not last["accepted"] and last["train_score"] == 1.0 and "no wrong" in last["reason"]

    saved = json.loads((tmp_path / "history.json").read_text(encoding="utf-8"))
    assert saved["best_version"] == 1 and [h["step"] for h in saved["steps"]] == [h["step"] for h in steps]
    assert (tmp_path / "S_v000.md").read_text(encoding="utf-8") == DEFAULT_GUIDELINE.text
    assert (tmp_path / "S_v001.md").read_text(encoding="utf-8") == result.best.text
    assert (tmp_path / "best.md").read_text(encoding="utf-8") == result.best.text


def test_a_candidate_that_scores_no_better_is_not_kept(tmp_path: Path) -> None:
    llm = scripted_world(["Be brief.\n{types}\n"])  # valid, but greedy extraction still keeps nothing
    result = induce(EXAMPLES[:2], EXAMPLES[2:], llm=llm, config=InductionConfig(steps=1, rollouts=2), out_dir=tmp_path)
    assert result.best.version == 0 and result.best_score == 0.0
    tried = result.history[-1]
    assert tried["version"] == 1 and tried["val_score"] == 0.0 and not tried["accepted"]
    assert "not better than S v0" in tried["reason"] and (tmp_path / "S_v001.md").exists()


def test_the_critique_contrasts_a_right_run_with_a_wrong_one() -> None:
    llm = ScriptedLLM([{"critique": "Keep the allergy."}])
    right = Trajectory("ex0", 0, ["[Preference, 2025-01-06] The user avoids loud hotels."], [], "B", True)
    wrong = Trajectory("ex0", 0, [], [], "A", False)
    assert critique(EXAMPLES[0], DEFAULT_GUIDELINE, wrong, right, llm) == "Keep the allergy."
    prompt = llm.calls[0].prompt
    assert "A run that went right:" in prompt and "The user avoids loud hotels." in prompt
    assert "A run that went wrong:" in prompt and "B. Vdara, a calm non-gaming hotel" in prompt
    assert "{types}" in prompt  # the critic sees S as it is, placeholders and all


def test_every_wrong_rollout_is_contrasted_with_a_right_one_taken_in_turn() -> None:
    # ex0, five rollouts: the greedy one and the sampled writes 1 and 3 keep nothing (wrong); writes 2 and 4 keep it
    llm = scripted_world([BETTER], explores=lambda said, n: n in (2, 4))
    config = InductionConfig(steps=1, batch_size=1, rollouts=5)
    result = induce(EXAMPLES[:1], EXAMPLES[2:], llm=llm, config=config)

    critic = prompts(llm, "You improve the guideline")
    assert len(critic) == 3  # one per wrong rollout, not only the first
    for prompt in critic:
        wrong = prompt[prompt.index("A run that went wrong:") :]
        assert "Memory written:\n  (nothing)" in wrong and "Answer given: A" in wrong
    rights = [re.findall(r"sampled write (\d)", p[: p.index("A run that went wrong:")]) for p in critic]
    assert rights == [["2"], ["4"], ["2"]]  # the right runs in turn
    step = result.history[1]
    assert len(step["critiques"]) == 3 and step["train_score"] == 0.4 and step["version"] == 1


def test_an_example_without_a_right_rollout_makes_no_edit() -> None:
    # only ex0's sampled write keeps its preference: ex1 went wrong every time and has nothing to contrast with
    llm = scripted_world([BETTER], explores=lambda said, n: said == "I avoid hotels with loud nightlife.")
    result = induce(EXAMPLES[:2], EXAMPLES[2:], llm=llm, config=InductionConfig(steps=1, batch_size=2, rollouts=2))
    critic = prompts(llm, "You improve the guideline")
    assert len(critic) == 1 and "I avoid hotels" in critic[0] and "vegetarian" not in critic[0]
    step = result.history[1]
    assert step["no_correct_rollout"] == ["ex1"] and len(step["critiques"]) == 1

    nobody = scripted_world([BETTER], explores=lambda said, n: False)  # no example has a right rollout
    result = induce(EXAMPLES[:2], EXAMPLES[2:], llm=nobody, config=InductionConfig(steps=1, batch_size=2, rollouts=2))
    assert prompts(nobody, "You improve the guideline") == []
    assert not any("Revise it to make these changes" in c.prompt for c in nobody.calls)  # no edit
    step = result.history[1]
    assert step["version"] == 0 and not step["accepted"] and sorted(step["no_correct_rollout"]) == ["ex0", "ex1"]
    assert step["reason"] == "no example with a wrong rollout had a right one to contrast it with"


def test_a_critic_outage_is_recorded_not_read_as_no_wrong_rollout(tmp_path: Path) -> None:
    llm = scripted_world([BETTER], critic=lambda prompt: LLMConnectionError("critic down"))
    config = InductionConfig(steps=1, batch_size=2, rollouts=2, seed=1)
    result = induce(EXAMPLES[:2], EXAMPLES[2:], llm=llm, config=config, out_dir=tmp_path)
    step = result.history[1]
    assert sorted(step["outages"]) == [
        "critic (ex0 rollout 1): LLMConnectionError: critic down",
        "critic (ex1 rollout 1): LLMConnectionError: critic down",
    ]
    assert step["reason"].startswith("no usable critique: 2 outage(s)") and "no wrong" not in step["reason"]
    assert step["critiques"] == [] and step["version"] == 0 and not step["accepted"]
    assert not any("Revise it to make these changes" in c.prompt for c in llm.calls)
    saved = json.loads((tmp_path / "history.json").read_text(encoding="utf-8"))
    assert saved["steps"][1]["outages"] == step["outages"]


FREE = [
    TrainingExample(f"free{i}", (Session("s", "2025-01-06", [Turn("user", said)]),), question, gold)
    for i, (said, question, gold) in enumerate(
        [("I live in Leeds.", "Where do I live?", "Leeds"), ("My sister is Ana.", "Who is my sister?", "Ana")]
    )
]


def test_a_judge_outage_leaves_rollouts_unjudged_and_is_recorded() -> None:
    def handler(messages: Sequence[Mapping[str, str]], schema: Any) -> Any:
        prompt = messages[0]["content"]
        if prompt.startswith("You keep a long-term memory"):
            return {"facts": []}
        if prompt.startswith("You are a personal assistant"):
            return {"answer": "I do not remember."}  # no gold in it: the LLM judge must decide
        if prompt.startswith("You grade an assistant's reply"):
            return LLMConnectionError("judge down")
        raise AssertionError(f"unexpected prompt: {prompt[:120]}")

    llm = ScriptedLLM(handler=handler)
    trajectory = rollout(FREE[0], DEFAULT_GUIDELINE, llm)
    assert not trajectory.judged and not trajectory.wrong and not trajectory.correct
    assert trajectory.error == "LLMConnectionError: judge down" and trajectory.answer == "I do not remember."

    result = induce(FREE[:1], FREE[1:], llm=llm, config=InductionConfig(steps=1, batch_size=1, rollouts=2))
    start, step = result.history
    assert start["outages"] == ["judge (validation free1): LLMConnectionError: judge down"]
    assert step["outages"] == [
        "judge (free0 rollout 1): LLMConnectionError: judge down",
        "judge (free0 rollout 2): LLMConnectionError: judge down",
    ]
    assert step["reason"].startswith("no usable critique: 2 outage(s)") and "no wrong" not in step["reason"]
    assert not any(c.prompt.startswith("You improve the guideline") for c in llm.calls)


def test_llm_failures_make_wrong_rollouts_not_errors() -> None:
    llm = ScriptedLLM(handler=lambda m, s: LLMConnectionError("down"))
    score, trajectories = evaluate(DEFAULT_GUIDELINE, EXAMPLES[:2], llm)
    assert score == 0.0 and all(not t.correct for t in trajectories)
    assert all(t.error and "down" in t.error for t in trajectories)


@pytest.mark.parametrize(
    ("answer", "letter"), [("B", "B"), ("b.", "B"), ("Option C", "C"), ("(A) the first", "A"), ("Maybe", None)]
)
def test_the_chosen_letter_is_read_leniently(answer: str, letter: str | None) -> None:
    assert chosen_letter(answer, 3) == letter


def test_free_answers_are_judged_by_containment_then_by_the_llm() -> None:
    free = TrainingExample("f", (), "Where do I live?", "Leeds")
    assert judge(free, "You live in Leeds, I think.", None)
    assert not judge(free, "In York.", None)
    llm = ScriptedLLM([{"correct": True}])
    assert judge(free, "In the city of the Royal Armouries.", llm) and "Reference answer" in llm.calls[0].prompt


# --------------------------------------------------------------------------- PrefEval


def _tiny_prefeval(root: Path) -> Path:
    (root / "explicit_preference").mkdir(parents=True)
    (root / "mcq_options").mkdir()
    items = [
        {"preference": f"I prefer option {i}.", "question": f"Question {i}?", "explanation": "x"} for i in range(6)
    ]
    mcq = [
        {**it, "classification_task_options": [f"good {i}", f"bad {i}a", f"bad {i}b", f"bad {i}c"]}
        for i, it in enumerate(items)
    ]
    (root / "explicit_preference" / "topic.json").write_text(json.dumps(items))
    (root / "mcq_options" / "topic.json").write_text(json.dumps(mcq))
    filler = [{"conversation": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] * 3
    (root / "filtered_inter_turns.json").write_text(json.dumps(filler))
    return root


def test_prefeval_examples_split_disjointly_with_the_respecting_option_as_gold(tmp_path: Path) -> None:
    train, val = prefeval_examples(_tiny_prefeval(tmp_path), train=4, val=2, fillers=2, seed=3)
    assert len(train) == 4 and len(val) == 2 and not {e.id for e in train} & {e.id for e in val}
    for e in train + val:
        n = e.id.rsplit(":", 1)[1]
        assert e.answer == f"good {n}" and e.options[ord(e.gold_letter) - 65] == f"good {n}"  # type: ignore[arg-type]
        assert [s.id for s in e.sessions] == ["pref", "filler1", "filler2"]
        assert e.sessions[0].turns[0].text == f"I prefer option {n}."
    assert {e.gold_letter for e in train + val} != {"A"}  # options are shuffled
    again, _ = prefeval_examples(tmp_path, train=4, val=2, fillers=2, seed=3)
    assert [e.options for e in again] == [e.options for e in train]  # the seed decides


@pytest.mark.skipif(not PREFEVAL.exists(), reason=f"no PrefEval data at {PREFEVAL}")
def test_prefeval_examples_from_the_real_data_span_topics() -> None:
    train, val = prefeval_examples(PREFEVAL, train=8, val=4)
    assert len({e.category for e in train + val}) == 12  # round-robin over the 20 topics
    assert all(len(e.options) == 4 and e.gold_letter for e in train + val)


def test_pgr_guideline_show_prints_s_with_its_placeholders(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["guideline", "show"]) == 0
    assert "{types}" in capsys.readouterr()[0]
    assert main(["guideline", "show", "--rendered"]) == 0
    assert "- Goal: what the user wants" in capsys.readouterr()[0]


def test_pgr_guideline_induce_needs_its_data_and_an_llm(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("PGR_LLM_BASE_URL", "PGR_LLM_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "PGR_LLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert main(["guideline", "induce"]) == 2 and "--data" in capsys.readouterr()[1]
    assert main(["guideline", "induce", "--data", str(PREFEVAL)]) == 2
    assert "needs an LLM" in capsys.readouterr()[1]


def test_pgr_guideline_induce_runs_end_to_end_over_http(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from loopback_llm import LoopbackLLM, Request, ok

    data = _tiny_prefeval(tmp_path / "prefeval")

    def reply(request: Request) -> Any:
        prompt = request.body["messages"][0]["content"]
        if prompt.startswith("You keep a long-term memory"):  # the sampled rollout keeps it too: one went right
            kept = "KEEP EVERY STATED PREFERENCE" in prompt or request.body.get("temperature", 0) > 0
            said = re.search(r"<conversation>\nuser: (.*)\n", prompt).group(1)  # type: ignore[union-attr]
            return ok(json.dumps({"facts": [{"text": f"The user said: {said}", "type": "Preference"}] if kept else []}))
        if "Which of these replies suits this user best" in prompt:
            options = re.findall(r"^([A-Z])\. (.*)$", prompt, re.MULTILINE)
            pick = next(letter for letter, text in options if text.startswith("good") == ("The user said" in prompt))
            return ok(json.dumps({"answer": pick}))
        if prompt.startswith("You improve the guideline"):
            return ok(json.dumps({"critique": "Keep stated preferences."}))
        if prompt.startswith("Several critiques"):
            return ok(json.dumps({"changes": ["Keep stated preferences."]}))
        return ok(json.dumps({"guideline": BETTER}))

    out = tmp_path / "run"
    with LoopbackLLM() as server:
        server.default = reply
        args = [
            "guideline",
            "induce",
            "--data",
            str(data),
            "--out",
            str(out),
            "--base-url",
            server.base_url,
            "--model",
            "m",
            "--train",
            "2",
            "--val",
            "2",
            "--steps",
            "1",
            "--batch",
            "2",
            "--rollouts",
            "2",
            "--embedder",
            "hashing",
        ]
        assert main(args) == 0
    printed = capsys.readouterr()[0]
    assert (
        "step 0: S v0 validation 0.000" in printed
        and "step 1: S v1 validation 1.000 (train batch 0.500)  kept" in printed
    )
    assert f"best: S v1 (1.000) -> {out / 'best.md'}" in printed
    assert json.loads((out / "history.json").read_text())["best_version"] == 1
