"""Answer quality: answers generated from each method's facts, compared pairwise by a judge LLM.

For one question and two methods A and B, each method's facts go into pgr's answer prompt (the same
prompt, the same LLM), then the judge compares the two answers twice with the order swapped
(:func:`~pgr_core.evaluation.metrics.win_rate`). A method answers as a user of it would: one whose
record carries a prospection summary (an LLM prospector's) answers as :meth:`PGR.answer` does (PAG:
R* in its order within ``answer_context_tokens``, and the summary); any other from its first ``k``
facts with no summary. A's win rate is the mean score over questions the judge could decide;
undecided ones are counted apart. Answers and verdicts are appended to the records file, so a
comparison resumes like a run does; an answer or verdict that failed (with llm-relay: a request not
yet answered) is asked again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pgr_core.errors import LLMError
from pgr_core.evaluation.data import EvalQuestion, EvalSet
from pgr_core.evaluation.metrics import win_rate
from pgr_core.evaluation.runner import Progress
from pgr_core.models.llm import LLM
from pgr_core.observability.trace import FoundFact, Trace
from pgr_core.policy.config import PGRConfig
from pgr_core.policy.pgr import ANSWER_TOKENS, answer_prompt
from pgr_core.policy.prospectors import Prospection
from pgr_core.stores.contract import Store

__all__ = ["answer_with", "compare_answers"]


def answer_with(
    llm: LLM, store: Store, q: EvalQuestion, ids: Sequence[str], *, k: int = 20, summary: str | None = None
) -> str | None:
    """pgr's answer prompt filled with the facts ``ids``: the first ``k`` with no summary, or, with a
    ``summary``, as :meth:`PGR.answer` fills it (PAG: as many as fit ``answer_context_tokens``, after
    the summary); None when the LLM fails."""
    if not store.capabilities.by_id:
        raise TypeError(
            "answer comparison needs a store that declares capabilities.by_id (get(fact_id, scope=...)), "
            "e.g. InMemoryStore"
        )
    get = store.get  # type: ignore[attr-defined]
    facts = [f for f in (get(i, scope=q.scope) for i in (ids if summary else ids[:k])) if f is not None]
    found = [FoundFact(fact=f, score=0.0, rank_score=0.0, round=0, probe="") for f in facts]
    p = Prospection(
        query=q.question,
        date=q.date,
        scope=q.scope,
        trace=Trace(query=q.question, strategy="answer", prospector="none"),
    )
    if summary:
        text = answer_prompt(p, found, summary, max_tokens=PGRConfig().answer_context_tokens)
    else:
        text = answer_prompt(p, found, None, limit=k)
    try:
        return llm.complete([{"role": "user", "content": text}], max_tokens=ANSWER_TOKENS).text.strip()
    except LLMError:
        return None


def compare_answers(
    data: EvalSet,
    records: list[dict[str, Any]],
    store: Store,
    first: str,
    second: str,
    *,
    llm: LLM,
    judge: LLM | None = None,
    k: int = 20,
    emit: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Win rate of ``first``'s answers against ``second``'s over the questions both methods ran."""
    judge = judge or llm
    by = {(r["method"], r["question"]): r for r in records}
    add = emit or records.append
    tag = f"_win:{first}:{second}"
    scores: list[float] = []
    undecided = 0
    # a degraded record holds part of a result (an LLM call failed): it is not what a user would get
    todo = [
        q for q in data.questions if all((m, q.id) in by and not by[(m, q.id)].get("degraded") for m in (first, second))
    ]
    progress = Progress(len(todo), f"answers {first} vs {second}")
    for q in todo:
        verdict = by.get((tag, q.id))
        if verdict is None or verdict["score"] is None:
            answers: dict[str, str | None] = {}
            for name in (first, second):
                kept = by.get((f"_answer:{name}", q.id))
                if kept is None or kept["text"] is None:
                    record = by[(name, q.id)]
                    summary = record.get("summary")
                    kept = {
                        "method": f"_answer:{name}",
                        "question": q.id,
                        "text": answer_with(llm, store, q, record["ids"], k=k, summary=summary or None),
                        "pag": bool(summary),
                    }
                    add(kept)
                    by[(kept["method"], q.id)] = kept
                answers[name] = kept["text"]
            score = None
            one, other = answers[first], answers[second]
            if one and other:
                context = "; ".join(q.references) or (f"a reference answer: {q.answer}" if q.answer else "")
                score = win_rate(judge, q.question, one, other, context=context).score
            verdict = {"method": tag, "question": q.id, "score": score}
            add(verdict)
            by[(tag, q.id)] = verdict
        if verdict["score"] is None:
            undecided += 1
        else:
            scores.append(verdict["score"])
        progress.step()
    return {
        "first": first,
        "second": second,
        "questions": len(todo),
        "decided": len(scores),
        "undecided": undecided,
        "win_rate": sum(scores) / len(scores) if scores else None,
    }


def win_rates(report: Mapping[str, Any]) -> list[str]:
    """Markdown lines for the comparisons in a report."""
    lines = []
    for c in report.get("win_rates", []):
        rate = "–" if c["win_rate"] is None else f"{c['win_rate']:.3f}"
        lines.append(
            f"- {c['first']} vs {c['second']}: win rate {rate} over {c['decided']} judged questions "
            f"({c['undecided']} undecided)"
        )
    return lines
