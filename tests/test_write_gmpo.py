"""GMPO: the guideline-adherence and answer rewards on hand-made cases, and (``nox -s gmpo``, the train
extra) the GRPO loop end to end on a tiny randomly initialised Qwen2 on CPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pgr_core.types import Fact, Scope
from pgr_core.write import DEFAULT_GUIDELINE, Session, Turn
from pgr_core.write.examples import TrainingExample
from pgr_core.write.rewards import (
    LexicalAnswerer,
    adherence_reward,
    answer_reward,
    gmpo_reward,
    memory_answer_reward,
)

GOOD = {"text": "The user is vegetarian.", "type": "Preference", "entities": ["meat"], "date": "2025-01-06"}
MCQ = TrainingExample(
    "ex",
    (Session("pref", "2025-01-06", [Turn("user", "I am vegetarian.")]),),
    "What should I cook tonight?",
    answer="A vegetarian lentil curry",
    options=("A grilled steak", "A vegetarian lentil curry", "Roast chicken"),
)


def _out(*facts: object) -> str:
    return json.dumps({"facts": list(facts)})


# --------------------------------------------------------------------------- guideline adherence


def test_a_well_formed_atomic_typed_extraction_scores_one() -> None:
    score = adherence_reward(_out(GOOD, {**GOOD, "text": "The user lives in Leeds.", "type": "Identity"}))
    assert (score.format, score.types, score.atomicity, score.fields, score.total, score.facts) == (1, 1, 1, 1, 1, 2)


def test_output_that_is_not_the_asked_json_scores_zero() -> None:
    assert adherence_reward("The user is vegetarian.").total == 0.0
    assert adherence_reward('{"memories": []}').total == 0.0  # no "facts" list


def test_an_empty_extraction_earns_only_the_format_part() -> None:
    score = adherence_reward(_out())
    assert score.format == 1.0 and score.total == 0.25


def test_each_part_counts_the_share_of_facts_that_follow_s() -> None:
    long = {**GOOD, "text": "The user " + "really " * 30 + "likes tea."}
    two_sentences = {**GOOD, "text": "The user likes tea. The user hates coffee."}
    bad_type = {**GOOD, "type": "Superpower"}
    bad_fields = {**GOOD, "date": "last Tuesday", "updates": "that one"}
    score = adherence_reward(_out(GOOD, long, two_sentences, bad_type, bad_fields))
    assert score.types == 0.8 and score.atomicity == 0.6 and score.fields == 0.8
    assert score.total == pytest.approx(0.25 * 1 + 0.25 * 0.8 + 0.3 * 0.6 + 0.2 * 0.8)


def test_the_word_limit_comes_from_the_guideline() -> None:
    eight_words = _out({**GOOD, "text": "The user cooks lentil curry on most Sundays."})
    assert adherence_reward(eight_words).atomicity == 1.0  # the default S allows 25 words
    strict = DEFAULT_GUIDELINE.edited(DEFAULT_GUIDELINE.text.replace("at most 25 words", "at most 5 words"))
    assert adherence_reward(eight_words, strict).atomicity == 0.0


# --------------------------------------------------------------------------- the answer


def test_the_answer_reward_scores_the_chosen_option() -> None:
    assert answer_reward("B", MCQ) == 1.0
    assert answer_reward("Option A", MCQ) == 0.0 and answer_reward("no idea", MCQ) == 0.0


def test_a_free_answer_scores_containment_then_token_f1() -> None:
    free = TrainingExample("f", (), "Where does the user live?", "in Leeds")
    assert answer_reward("They live in Leeds, near the river.", free) == 1.0
    assert answer_reward("Leeds", free) == pytest.approx(2 * 1.0 * 0.5 / 1.5)  # precision 1, recall 1/2
    assert answer_reward("York", free) == 0.0


def test_the_memory_answer_reward_answers_from_the_extracted_facts() -> None:
    answerer = LexicalAnswerer()
    kept = _out({"text": "The user is vegetarian and eats lentil curry.", "type": "Preference"})
    assert memory_answer_reward(kept, MCQ, answerer) == 1.0
    assert memory_answer_reward(_out(), MCQ, answerer) == 0.0  # nothing remembered: the answerer says A
    assert memory_answer_reward("garbage", MCQ, answerer) == 0.0
    facts = [Fact("f", "The user likes grilled steak.", Scope(user_id="u"))]
    assert answerer(MCQ, facts) == "A"


def test_the_gmpo_reward_mixes_the_two() -> None:
    assert gmpo_reward(1.0, 0.0, alpha=0.5) == 0.5 and gmpo_reward(0.4, 1.0, alpha=0.25) == pytest.approx(0.85)
    with pytest.raises(ValueError, match="alpha"):
        gmpo_reward(1.0, 1.0, alpha=1.5)


# --------------------------------------------------------------------------- the training loop (train extra)


def _gguf() -> Path | None:
    named = os.environ.get("PGR_GMPO_GGUF")
    if named:
        return Path(named)
    cached = sorted((Path.home() / ".cache" / "pgr-local-llm").glob("*.gguf"))
    return cached[0] if cached else None


@pytest.mark.gmpo
def test_grpo_trains_a_tiny_random_model_end_to_end_on_cpu(tmp_path: Path) -> None:
    pytest.importorskip("trl", reason="needs the train extra: pip install 'pgr[train]' (nox -s gmpo)")
    from transformers import AutoModelForCausalLM

    from pgr_core.write.gmpo import GMPOConfig, train

    config = GMPOConfig(
        out=str(tmp_path),
        tiny=True,
        steps=2,
        batch_size=8,
        num_generations=4,
        max_completion_length=48,
        warm_start_steps=150,
    )
    summary = train(config)
    print(
        "\n"
        + json.dumps(
            {
                "warm_start_last_loss": summary["warm_start_losses"][-1],
                "history": [
                    {
                        k: h.get(k)
                        for k in (
                            "step",
                            "reward",
                            "reward_std",
                            "rewards/guideline_adherence/mean",
                            "rewards/answer_correctness/mean",
                            "grad_norm",
                            "loss",
                        )
                    }
                    for h in summary["history"]
                ],
            },
            indent=1,
        )
    )
    assert summary["steps"] == 2 and summary["rows"] == 4
    steps = [h for h in summary["history"] if "rewards/guideline_adherence/mean" in h]
    assert len(steps) == 2 and all("rewards/answer_correctness/mean" in h for h in steps)
    assert summary["warm_start_losses"][-1] < summary["warm_start_losses"][0] / 4
    # the warm-started model samples extractions that differ in reward (two groups of four per step), so
    # GRPO has a gradient to follow
    assert any(h["reward_std"] > 0 and h["grad_norm"] > 0 for h in steps)
    reloaded = AutoModelForCausalLM.from_pretrained(summary["model"])
    assert reloaded.config.model_type == "qwen2" and reloaded.config.num_hidden_layers == 2
    assert json.loads((tmp_path / "gmpo.json").read_text())["steps"] == 2


@pytest.mark.gmpo
@pytest.mark.skipif(
    _gguf() is None, reason="no GGUF file (set PGR_GMPO_GGUF, or ../shared/tools/local-llm fetch small)"
)
def test_grpo_runs_with_the_tokenizer_of_a_qwen_gguf(tmp_path: Path) -> None:
    pytest.importorskip("trl", reason="needs the train extra: pip install 'pgr[train]' (nox -s gmpo)")
    pytest.importorskip("gguf", reason="needs the gguf package (the train extra)")
    from pgr_core.write.gmpo import GMPOConfig, train

    config = GMPOConfig(
        out=str(tmp_path),
        tiny=True,
        tokenizer_gguf=str(_gguf()),
        steps=1,
        examples=2,
        batch_size=2,
        num_generations=2,
        max_completion_length=8,
    )
    summary = train(config)
    assert summary["steps"] == 1 and "rewards/guideline_adherence/mean" in summary["history"][0]
