"""The report as a Markdown table, a PNG chart (matplotlib, ``pip install 'pgr[eval]'``) and JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pgr_core.evaluation.runner import BUDGETS

__all__ = ["markdown", "write_chart", "write_report"]


def _f(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _name(name: str, m: Mapping[str, Any]) -> str:
    """The row's name, marked with how many of its questions are degraded (when any are)."""
    k = m.get("degraded_questions", 0)
    return f"{name} ⚠ {k} degraded" if k else name


def _table(methods: Mapping[str, Mapping[str, Any]]) -> list[str]:
    budgets = " | ".join(f"recall@{b}" for b in BUDGETS)
    lines = [
        f"| method | n | {budgets} | recall (all) | facts | query-only at that size | RecallExact@20 "
        "| recall@20, hard third | judged recall@20 | LLM calls | tokens | s/query | store calls | degraded |",
        "|---" * (13 + len(BUDGETS)) + "|",
    ]
    for name, m in methods.items():
        at = " | ".join(_f(m["recall_at"].get(str(b))) for b in BUDGETS)
        lines.append(
            f"| {_name(name, m)} | {m['questions']} | {at} | {_f(m['recall'])} | {_f(m['facts'], 1)} "
            f"| {_f(m['query_only_same_size'])} | {_f(m['recall_exact_at'].get('20'))} "
            f"| {_f(m['recall_at_20_hard_third'])} | {_f(m['judged_recall'])} | {_f(m['llm_calls'], 2)} "
            f"| {_f(m['tokens'], 0)} | {_f(m['seconds'], 2)} | {_f(m['store_calls'], 2)} | {_f(m['degraded'], 2)} |"
        )
    return lines


def markdown(report: Mapping[str, Any]) -> str:
    """The main table (every method on the same questions), then, when they differ, each method over
    its own questions, the win rates and recall@20 by category."""
    methods: Mapping[str, Mapping[str, Any]] = report["methods"]
    own: Mapping[str, Mapping[str, Any] | None] = report.get("own_questions") or {}
    lines = [f"{report['dataset']}: {report['questions']} questions"]
    lines += [f"- {note}" for note in report.get("notes", [])]
    compared = report.get("compared_questions", report["questions"])
    if own or compared != report["questions"]:
        lines.append(
            f"- compared on the same {compared} of the {report['questions']} questions: those every method "
            "below has a record for (n)"
        )
    if report.get("without_records"):
        lines.append(f"- no records (not run, or skipped): {', '.join(report['without_records'])}")
    lines.append("")
    if methods:
        lines += _table(methods)
    else:
        lines.append("(no question has a record of every method: see the table of own questions)")
    if own:
        lines += [
            "",
            "Own questions, not comparable: each method below over every question it has a record for "
            "(other sets of questions than the table above, and than each other):",
            "",
        ]
        lines += _table({name: m for name, m in own.items() if m is not None})
    from pgr_core.evaluation.answers import win_rates

    if report.get("win_rates"):
        lines += ["", "Answer win rates (judge LLM, both orders; a tie or split verdict counts 0.5):", ""]
        lines += win_rates(report)
    cats = sorted({c for m in methods.values() for c in m["by_category"]}, key=lambda c: (len(c), c))
    if cats and any(cats):
        lines += [
            "",
            f"recall@20 by category (the same {compared} questions):",
            "",
            "| method | " + " | ".join(c or "(none)" for c in cats) + " |",
            "|---" * (len(cats) + 1) + "|",
        ]
        for name, m in methods.items():
            lines.append(f"| {_name(name, m)} | " + " | ".join(_f(m["by_category"].get(c)) for c in cats) + " |")
    return "\n".join(lines) + "\n"


def write_chart(report: Mapping[str, Any], path: Path) -> Path | None:
    """Recall@N per method (LLM calls in the labels), and each method's whole list against query-only cut at
    the same size. None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    methods: Mapping[str, Mapping[str, Any]] = report["methods"]
    names = list(methods)
    labels = [f"{n}\n{methods[n]['llm_calls']:.1f} LLM calls" if methods[n].get("llm_calls") else n for n in names]
    fig, (ax, same) = plt.subplots(
        1, 2, figsize=(max(10, 2.2 * len(names) + 4), 4.8), gridspec_kw={"width_ratios": [3, 2]}
    )
    width = 0.8 / len(BUDGETS)
    for i, b in enumerate(BUDGETS):
        values = [methods[n]["recall_at"].get(str(b)) or 0.0 for n in names]
        xs = [x + (i - (len(BUDGETS) - 1) / 2) * width for x in range(len(names))]
        bars = ax.bar(xs, values, width, label=f"recall@{b}")
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(names)), labels, rotation=25, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("evidence recall")
    compared = report.get("compared_questions", report["questions"])
    ax.set_title(f"{report['dataset']}: the same {compared} questions, at a fixed number of facts", fontsize=10)
    ax.legend(fontsize=8)
    # everything a method returned, against the question's own list cut at the same size
    xs = list(range(len(names)))
    mine = [methods[n]["recall"] or 0.0 for n in names]
    base = [methods[n]["query_only_same_size"] or 0.0 for n in names]
    b1 = same.bar([x - 0.2 for x in xs], mine, 0.4, label="all it returned")
    b2 = same.bar([x + 0.2 for x in xs], base, 0.4, label="query-only, same size", color="grey")
    same.bar_label(b1, fmt="%.2f", fontsize=7)
    same.bar_label(b2, fmt="%.2f", fontsize=7)
    facts = [f"{n}\n{methods[n]['facts']:.0f} facts" for n in names]
    same.set_xticks(xs, facts, rotation=25, ha="right", fontsize=8)
    same.set_ylim(0, 1)
    same.set_title("whole list vs query-only at that size", fontsize=10)
    same.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(report: Mapping[str, Any], json_path: Path) -> dict[str, Path | None]:
    """Write ``json_path``, and the Markdown and PNG beside it (same name, ``.md`` and ``.png``)."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2), encoding="utf-8")
    md = json_path.with_suffix(".md")
    md.write_text(markdown(report), encoding="utf-8")
    return {"json": json_path, "markdown": md, "chart": write_chart(report, json_path.with_suffix(".png"))}
