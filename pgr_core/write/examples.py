"""Training examples for guideline induction: a history, a later question, and its gold answer.

:func:`prefeval_examples` reads PrefEval (``../shared/data/prefeval``): each explicit preference
becomes a history (the user stating it, then ``fillers`` unrelated conversations) and its question;
with ``options`` the answer is scored as multiple choice over PrefEval's ``mcq_options`` (the first
option listed there is the one that respects the preference; pgr shuffles the four per example).
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from pgr_core._dates import parse_date
from pgr_core.datasets import prefeval_root
from pgr_core.errors import InvalidArgumentError
from pgr_core.write.sessions import Session, Turn

__all__ = ["TrainingExample", "prefeval_examples"]


@dataclass(frozen=True)
class TrainingExample:
    """One example: the sessions to remember, then a question asked after them.

    ``answer`` is the gold: one of ``options`` for multiple choice, or a reference text to judge a
    free answer against.
    """

    id: str
    sessions: tuple[Session, ...]
    question: str
    answer: str
    options: tuple[str, ...] = ()
    date: datetime | None = None
    category: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "date", parse_date(self.date, what=f"example {self.id} date"))
        if self.options and self.answer not in self.options:
            raise InvalidArgumentError(f"example {self.id}: the answer must be one of its options")

    @property
    def gold_letter(self) -> str | None:
        return string.ascii_uppercase[self.options.index(self.answer)] if self.options else None

    def options_block(self) -> str:
        return "\n".join(f"{string.ascii_uppercase[i]}. {o}" for i, o in enumerate(self.options))


def prefeval_examples(
    path: str | Path,
    *,
    train: int = 8,
    val: int = 4,
    fillers: int = 0,
    seed: int = 0,
    options: bool = True,
    start: str = "2025-01-06",
) -> tuple[list[TrainingExample], list[TrainingExample]]:
    """Two disjoint splits of PrefEval's explicit preferences, drawn with ``seed`` across its 20 topics.

    Each history: session ``pref`` (the user states the preference) then ``fillers`` filler
    conversations a day apart; the question comes a day after the last. ``options=False`` keeps
    PrefEval's explanation as the reference answer (judged by an LLM) instead of multiple choice.
    """
    if train < 0 or val < 0 or train + val == 0:
        raise InvalidArgumentError("train and val must be >= 0, and not both 0")
    root = prefeval_root(path)
    rng = random.Random(seed)
    fillers_pool = json.loads((root / "filtered_inter_turns.json").read_text(encoding="utf-8"))
    if fillers > len(fillers_pool):
        raise InvalidArgumentError(f"fillers must be at most {len(fillers_pool)}")
    by_topic: dict[str, list[tuple[int, dict, dict | None]]] = {}
    for topic_file in sorted((root / "explicit_preference").glob("*.json")):
        items = json.loads(topic_file.read_text(encoding="utf-8"))
        mcq_file = root / "mcq_options" / topic_file.name
        mcq = json.loads(mcq_file.read_text(encoding="utf-8")) if mcq_file.exists() else []
        rows = []
        for i, item in enumerate(items):
            choice = mcq[i] if i < len(mcq) and mcq[i].get("question") == item["question"] else None
            if options and (choice is None or len(choice.get("classification_task_options") or []) < 2):
                continue  # no aligned multiple-choice options for this one
            rows.append((i, item, choice))
        rng.shuffle(rows)
        by_topic[topic_file.stem] = rows
    # round-robin over topics so a small split still spans many of them
    drawn: list[tuple[str, int, dict, dict | None]] = []
    topics = sorted(by_topic)
    rng.shuffle(topics)
    while len(drawn) < train + val and any(by_topic.values()):
        for topic in topics:
            if by_topic[topic] and len(drawn) < train + val:
                i, item, choice = by_topic[topic].pop()
                drawn.append((topic, i, item, choice))
    if len(drawn) < train + val:
        raise InvalidArgumentError(f"PrefEval has only {len(drawn)} usable examples, asked for {train + val}")
    day0 = datetime.fromisoformat(start)
    examples = []
    for topic, i, item, choice in drawn:
        sessions = [Session("pref", day0, [Turn("user", item["preference"])])]
        for k, conv in enumerate(rng.sample(fillers_pool, fillers), start=1):
            turns = [Turn(t.get("role", "user"), t.get("content", "")) for t in conv["conversation"]]
            sessions.append(Session(f"filler{k}", day0 + timedelta(days=k), turns))
        if options:
            assert choice is not None
            opts = list(choice["classification_task_options"])
            gold = opts[0]  # PrefEval lists the option that respects the preference first
            rng.shuffle(opts)
            extra = {"answer": gold, "options": tuple(opts)}
        else:
            extra = {"answer": item.get("explanation") or item["preference"], "options": ()}
        examples.append(
            TrainingExample(
                id=f"prefeval:{topic}:{i}",
                sessions=tuple(sessions),
                question=item["question"],
                date=day0 + timedelta(days=fillers + 1),
                category=topic,
                **extra,  # type: ignore[arg-type]
            )
        )
    return examples[:train], examples[train:]
