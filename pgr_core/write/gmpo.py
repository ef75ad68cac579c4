"""GMPO, MemCoE's second stage: train the memory model itself with GRPO on a reward mixing guideline
adherence and answer correctness (``pip install 'pgr[train]'``: TRL, transformers, datasets).

Each training row is one session's extraction prompt (the prompt :class:`~pgr_core.write.Ingestor`
sends, with the guideline S). For every prompt GRPO samples ``num_generations`` extractions from the
model, scores each with

- :func:`~pgr_core.write.rewards.adherence_reward` (does it follow S: format, types, atomicity), and
- :func:`~pgr_core.write.rewards.memory_answer_reward` (its facts become the memory; an answerer
  answers the example's question from them; right or wrong),

mixed as α · adherence + (1 − α) · answer (TRL's ``reward_weights``), and moves the model toward the
extractions that scored above their group's mean.

Smoke run (CPU, seconds; what ``nox -s gmpo`` proves): a tiny randomly initialised Qwen2 with a
word-level tokenizer built from the prompts (or the tokenizer of a Qwen2.5 GGUF file)::

    python -m pgr_core.write.gmpo --tiny --steps 2 --out runs/gmpo-smoke
    python -m pgr_core.write.gmpo --tiny --tokenizer-gguf ~/.cache/pgr-local-llm/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf

Real training (a GPU; not run in CI)::

    pip install 'pgr[train]'
    # a Hugging Face model folder (e.g. Qwen2.5-0.5B/1.5B-Instruct) copied to the machine, PrefEval
    # histories as training data, the LLM of your serving stack as the answerer:
    python -m pgr_core.write.gmpo --model /models/Qwen2.5-1.5B-Instruct --prefeval ../shared/data/prefeval \\
        --examples 400 --steps 300 --batch-size 8 --num-generations 8 --max-completion-length 512 \\
        --learning-rate 1e-6 --alpha 0.5 --guideline runs/mgi/best.md \\
        --answer-base-url http://127.0.0.1:8000/v1 --answer-model qwen --device auto --out runs/gmpo

  Use the guideline that induction kept (``pgr guideline induce``) as ``--guideline``, so GMPO trains
  the model to follow the learned S. With ``--gguf FILE`` the weights come from a GGUF file instead
  (dequantised by transformers; about 4 GB of RAM for 0.5B). The model is saved to ``--out`` and can be
  served by vLLM or llama.cpp and used as the ``llm`` of :class:`~pgr_core.write.Ingestor`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pgr_core.errors import ConfigurationError
from pgr_core.write.examples import TrainingExample, prefeval_examples
from pgr_core.write.extract import extraction_messages
from pgr_core.write.guideline import DEFAULT_GUIDELINE, Guideline
from pgr_core.write.rewards import Answerer, LexicalAnswerer, LLMAnswerer, adherence_reward, memory_answer_reward
from pgr_core.write.sessions import Session, Turn

__all__ = ["BUILTIN_EXAMPLES", "GMPOConfig", "build_rows", "reward_functions", "train"]


def _builtin(i: int, preference: str, question: str, good: str, bad: Sequence[str]) -> TrainingExample:
    options = (*bad[: i % 3], good, *bad[i % 3 :])
    return TrainingExample(
        id=f"builtin:{i}",
        sessions=(Session("pref", "2025-01-06", [Turn("user", preference)]),),
        question=question,
        answer=good,
        options=options,
        date=datetime(2025, 1, 8),
    )


# A few histories of our own, so the smoke run needs no data set on disk.
BUILTIN_EXAMPLES = [
    _builtin(
        0,
        "I avoid hotels with a loud nightlife.",
        "Which hotel should I book in Las Vegas?",
        "A quiet non-gaming resort",
        ["A casino hotel with nightclubs", "A party hostel on the Strip"],
    ),
    _builtin(
        1,
        "I am vegetarian and never eat meat.",
        "What should I cook for dinner tonight?",
        "A lentil and spinach curry",
        ["A grilled rib-eye steak", "Roast chicken with potatoes"],
    ),
    _builtin(
        2,
        "I get seasick on any boat.",
        "How should I spend a free day in Sydney?",
        "A walk through the botanic garden",
        ["A sailing trip around the harbour", "A ferry ride to Manly"],
    ),
    _builtin(
        3,
        "I hate crowded places.",
        "Where should I watch the football final?",
        "At home with a couple of friends",
        ["In a packed sports bar", "In the stadium's standing area"],
    ),
]


@dataclass
class GMPOConfig:
    """The run's settings (see the module docstring for a GPU-sized example)."""

    out: str = "gmpo-out"
    model: str | None = None  # a Hugging Face model folder; None with tiny=True: a random tiny Qwen2
    gguf: str | None = None  # weights and tokenizer from a GGUF file
    tiny: bool = False
    tokenizer_gguf: str | None = None  # tiny model: take the tokenizer of this GGUF file (else a small BPE)
    warm_start_steps: int = 0  # supervised steps on reference extractions before GRPO (the smoke run: 60)
    prefeval: str | None = None  # training histories from PrefEval (else the built-in examples)
    examples: int = 4
    guideline: str | None = None  # a guideline file (default: the built-in S)
    steps: int = 2
    batch_size: int = 2
    num_generations: int = 2
    max_completion_length: int = 24
    learning_rate: float = 1e-5
    alpha: float = 0.5
    temperature: float = 1.0
    beta: float = 0.0  # KL weight (0: no reference model, as current GRPO recipes do)
    answer_base_url: str | None = None
    answer_model: str | None = None
    device: str = "cpu"
    seed: int = 0


# --------------------------------------------------------------------------- data


def build_rows(examples: Sequence[TrainingExample], guideline: Guideline) -> list[dict[str, Any]]:
    """One row per session: the extraction prompt and the example it belongs to."""
    rows = []
    for example in examples:
        for session in example.sessions:
            rows.append(
                {
                    "prompt": extraction_messages(session, guideline, [])[0]["content"],
                    "example_id": example.id,
                    "session_id": session.id,
                }
            )
    return rows


def _completion_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))  # conversational: [{"role": "assistant", ...}]
    return str(completion)


def reward_functions(
    examples: Sequence[TrainingExample], guideline: Guideline, answerer: Answerer
) -> list[Callable[..., list[float]]]:
    """The two GMPO rewards in TRL's shape: ``f(prompts, completions, example_id, **kw) -> list[float]``."""
    by_id = {e.id: e for e in examples}

    def guideline_adherence(completions: Sequence[Any], **_: Any) -> list[float]:
        return [adherence_reward(_completion_text(c), guideline).total for c in completions]

    def answer_correctness(completions: Sequence[Any], example_id: Sequence[str], **_: Any) -> list[float]:
        return [
            memory_answer_reward(_completion_text(c), by_id[e], answerer)
            for c, e in zip(completions, example_id, strict=True)
        ]

    return [guideline_adherence, answer_correctness]


# --------------------------------------------------------------------------- model and tokenizer


def bpe_tokenizer(texts: Sequence[str], vocab_size: int = 600) -> Any:
    """A small byte-level BPE tokenizer trained on ``texts`` in a blink: offline, and it decodes back to
    the exact text, so a sampled extraction can be parsed as JSON."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(list(texts), trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>")
    tok.padding_side = "left"
    return tok


def reference_completion(example: TrainingExample) -> str:
    """A well-formed extraction for a preference history: what the warm start teaches the tiny model."""
    said = example.sessions[0].turns[0].text
    return json.dumps({"facts": [{"text": said, "type": "Preference"}]})


def warm_start(
    model: Any, tokenizer: Any, pairs: Sequence[tuple[str, str]], *, steps: int, lr: float = 3e-3, seed: int = 0
) -> list[float]:
    """A few supervised steps on (prompt, completion) pairs, loss on the completion only, so a random
    tiny model samples extractions that sometimes parse: GRPO then sees rewards that differ within a
    group and has a gradient to follow. Returns the loss per step."""
    import torch

    torch.manual_seed(seed)
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr)
    eos = tokenizer.eos_token or ""
    encoded = []
    for prompt, completion in pairs:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        c = tokenizer(completion + eos, add_special_tokens=False)["input_ids"]
        encoded.append((torch.tensor([p + c]), torch.tensor([[-100] * len(p) + c])))
    losses = []
    model.train()
    for step in range(steps):
        ids, labels = encoded[step % len(encoded)]
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimiser.step()
        optimiser.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def gguf_tokenizer(path: str) -> Any:
    """The tokenizer stored in a GGUF file (needs the ``gguf`` package)."""
    from transformers import AutoTokenizer

    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigurationError(f"no GGUF file at {file} (`../shared/tools/local-llm fetch small` makes one)")
    tok = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    tok.chat_template = None  # the tiny model is trained on plain prompts
    return tok


def tiny_model(vocab_size: int, *, seed: int = 0) -> Any:
    """A randomly initialised Qwen2 of about a million parameters plus embeddings."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def load_model_and_tokenizer(config: GMPOConfig, prompts: Sequence[str]) -> tuple[Any, Any]:
    if config.tiny:
        tok = gguf_tokenizer(config.tokenizer_gguf) if config.tokenizer_gguf else bpe_tokenizer(prompts)
        model = tiny_model(len(tok), seed=config.seed)
        model.config.pad_token_id = tok.pad_token_id
        model.config.eos_token_id = tok.eos_token_id
        return model, tok
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if config.gguf:
        file = Path(config.gguf).expanduser()
        tok = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
        model = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name)
    elif config.model:
        tok = AutoTokenizer.from_pretrained(config.model)
        model = AutoModelForCausalLM.from_pretrained(config.model)
    else:
        raise ConfigurationError("say which model to train: --model DIR, --gguf FILE, or --tiny for a smoke run")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return model, tok


# --------------------------------------------------------------------------- the run


def train(config: GMPOConfig, *, examples: Sequence[TrainingExample] | None = None) -> dict[str, Any]:
    """Run GRPO; returns the logged history (rewards per step) and where the model was saved."""
    try:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        raise ConfigurationError(f"GMPO training needs the train extra: pip install 'pgr[train]' ({exc})") from exc

    guideline = Guideline.load(config.guideline) if config.guideline else DEFAULT_GUIDELINE
    if examples is None:
        if config.prefeval:
            examples, _ = prefeval_examples(config.prefeval, train=config.examples, val=0, seed=config.seed)
        else:
            examples = BUILTIN_EXAMPLES[: config.examples]
    rows = build_rows(examples, guideline)
    by_id = {e.id: e for e in examples}
    references = {e.id: reference_completion(e) for e in examples}
    model, tokenizer = load_model_and_tokenizer(config, [r["prompt"] for r in rows] + list(references.values()))
    warm: list[float] = []
    if config.warm_start_steps:
        pairs = [(r["prompt"], references[r["example_id"]]) for r in rows if by_id[r["example_id"]].sessions]
        warm = warm_start(model, tokenizer, pairs, steps=config.warm_start_steps, seed=config.seed)
    conversational = getattr(tokenizer, "chat_template", None) is not None
    if conversational:
        rows = [{**r, "prompt": [{"role": "user", "content": r["prompt"]}]} for r in rows]
    if config.answer_base_url:
        from pgr_core.models.llm import OpenAICompatible

        answerer: Answerer = LLMAnswerer(OpenAICompatible(base_url=config.answer_base_url, model=config.answer_model))
    else:
        answerer = LexicalAnswerer()
    args = GRPOConfig(
        output_dir=config.out,
        max_steps=config.steps,
        per_device_train_batch_size=config.batch_size,
        num_generations=config.num_generations,
        max_completion_length=config.max_completion_length,
        learning_rate=config.learning_rate,
        temperature=config.temperature,
        beta=config.beta,
        reward_weights=[config.alpha, 1.0 - config.alpha],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=config.device == "cpu",
        bf16=False,
        seed=config.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_functions(examples, guideline, answerer),
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    trainer.train()
    out = Path(config.out)
    trainer.save_model(str(out / "model"))
    history = [h for h in trainer.state.log_history if "loss" in h or "reward" in h]
    summary = {
        "config": asdict(config),
        "steps": trainer.state.global_step,
        "history": history,
        "warm_start_losses": [round(x, 4) for x in warm],
        "model": str(out / "model"),
        "rows": len(rows),
        "guideline": guideline.id,
    }
    (out / "gmpo.json").write_text(json.dumps(summary, indent=1, default=str), encoding="utf-8")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pgr_core.write.gmpo", description=__doc__.split("\n\n")[0])
    defaults = GMPOConfig()
    for name, value in asdict(defaults).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            p.add_argument(flag, action="store_true")
        else:
            kind = type(value) if value is not None else str
            p.add_argument(flag, type=kind, default=value)
    config = GMPOConfig(**vars(p.parse_args(argv)))
    summary = train(config)
    for row in summary["history"]:
        print(
            json.dumps(
                {
                    k: row[k]
                    for k in sorted(row)
                    if k in ("step", "loss", "reward", "reward_std") or k.startswith("rewards/")
                }
            )
        )
    print(f"trained {summary['steps']} step(s); model saved to {summary['model']}", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
