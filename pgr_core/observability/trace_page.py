"""One self-contained HTML page showing what prospection did for a set of queries.

>>> from pgr_core import PGR, HashingEmbedder, InMemoryStore, Scope
>>> from pgr_core.observability.trace_page import write_trace_page
>>> store, s = InMemoryStore(embedder=HashingEmbedder()), Scope(user_id="u1")
>>> store.add("I twisted my knee playing football in March", scope=s, date="2025-03-10", id="f12")
'f12'
>>> _ = store.add("Rent went up by a hundred pounds a month", scope=s, date="2025-04-02")
>>> pgr = PGR(store, strategy="feedback")  # no LLM: the request, then the request with its first hits
>>> q = "Should I join a soccer league this summer?"
>>> page = write_trace_page("trace.html", [{
...     "query": q, "date": "2025-05-01",
...     "query_only": pgr.query_only(q, scope=s, date="2025-05-01").to_dict(),
...     "pgr": pgr.retrieve(q, scope=s, date="2025-05-01").to_dict(),
...     "relevant": ["f12"], "why": {"f12": "the knee injury rules out contact sport"},
... }])
>>> page.name, q in page.read_text(encoding="utf-8")
('trace.html', True)

For each query the page shows the trace header (prospector, stop reason, usage), the prospection
tree, a table of rounds, which facts each probe found, query-only and PGR facts side by side, and
the prospection summary. It has inline CSS only: no scripts, no external assets, no network.
Every piece of text from the trace is HTML-escaped, since facts are user data.
"""

from __future__ import annotations

import html
import pathlib
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["trace_page", "write_trace_page"]


def trace_page(queries: list[dict], *, title: str = "pgr prospection trace") -> str:
    """Render ``queries`` as one HTML page and return it.

    Each item is a dict with ``query``, ``date``, ``query_only`` and ``pgr`` (each a
    ``RetrievalResult.to_dict()``; a ``RetrievalResult`` itself is accepted too), ``relevant`` (fact ids
    known to matter, may be empty) and optionally ``why`` (fact id -> the reason it matters).
    """
    items = list(queries)
    parts = [
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n',
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
        f"<title>{_e(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n",
        f"<h1>{_e(title)}</h1>\n",
        _LEGEND,
    ]
    if not items:
        parts.append('<p class="muted">No queries.</p>\n')
    elif len(items) > 1:
        parts.append('<nav class="toc"><b>Queries</b><ol>')
        for n, item in enumerate(items, 1):
            parts.append(f'<li><a href="#q{n}">{_e(_as_map(item).get("query") or "(no query)")}</a></li>')
        parts.append("</ol></nav>\n")
    for n, item in enumerate(items, 1):
        parts.append(_QueryView(n, _as_map(item)).render())
    parts.append("</body>\n</html>\n")
    return "".join(parts)


def write_trace_page(path: str | pathlib.Path, queries: list[dict], **kw: Any) -> pathlib.Path:
    """Write :func:`trace_page` (UTF-8) to ``path``, creating its folder if needed, and return the path."""
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(trace_page(queries, **kw), encoding="utf-8")
    return out


# ====================================================================== one query


class _QueryView:
    def __init__(self, n: int, item: Mapping[str, Any]) -> None:
        self.n = n
        self.item = item
        self.pgr = _as_map(item.get("pgr"))
        self.qo = _as_map(item.get("query_only"))
        self.trace = _as_map(self.pgr.get("trace"))
        self.rounds = [_as_map(r) for r in _as_list(self.trace.get("rounds"))]
        self.pgr_facts = [_as_map(f) for f in _as_list(self.pgr.get("facts"))]
        self.qo_facts = [_as_map(f) for f in _as_list(self.qo.get("facts"))]
        self.relevant = list(dict.fromkeys(str(r) for r in _as_list(item.get("relevant"))))
        self.relevant_set = set(self.relevant)
        self.why = {str(k): str(v) for k, v in _as_map(item.get("why")).items()}
        # fact texts by id: PGR's facts first, query-only's for any hit PGR did not keep (augment hits)
        self.texts: dict[str, Mapping[str, Any]] = {}
        for f in self.qo_facts + self.pgr_facts:
            if f.get("id") is not None:
                self.texts[str(f["id"])] = f
        self.pgr_ids = {str(f.get("id")) for f in self.pgr_facts}
        self.qo_ids = {str(f.get("id")) for f in self.qo_facts}
        # both lists are compared at the same size: the query-only list's (R*'s head, as top(n) gives it)
        self.budget = len(self.qo_facts) if self.qo_facts else len(self.pgr_facts)
        self.pgr_head = self.pgr_facts[: self.budget]
        self.head_ids = {str(f.get("id")) for f in self.pgr_head}

    def render(self) -> str:
        query = self.item.get("query") or self.trace.get("query") or "(no query)"
        return "".join(
            [
                f'<section class="query" id="q{self.n}">\n',
                f'<h2><span class="qn">Q{self.n}</span> {_e(query)}</h2>\n',
                self._header(),
                self._tree(),
                self._rounds_table(),
                self._probes(),
                self._side_by_side(),
                self._summary(),
                "</section>\n",
            ]
        )

    # ------------------------------------------------------------------ 1. header

    def _header(self) -> str:
        t = self.trace
        usage = _as_map(t.get("usage"))
        date = self.item.get("date") or t.get("date")
        store_calls = t.get("store_calls")
        if store_calls is None and self.rounds:
            store_calls = sum(_int(r.get("store_calls")) for r in self.rounds)
        rows: list[tuple[str, str]] = [
            ("date", _e(date) if date else '<span class="muted">none</span>'),
            ("prospector / strategy", f"{_e(t.get('prospector') or '—')} / {_e(t.get('strategy') or '—')}"),
        ]
        intent = t.get("intent")
        if intent and intent != (self.item.get("query") or t.get("query")):
            rows.append(("intent (q_A)", _e(intent)))
        if t.get("centring") is not None:
            rows.append(("scores", f"centred on the user's memory (w = {_e(_num(t.get('centring')))})"))
        elif t.get("centring_off"):
            rows.append(("scores", f"not centred: {_e(t.get('centring_off'))}"))
        rows += [
            ("stop reason", f"<code>{_e(t.get('stop_reason') or '—')}</code>"),
            (
                "degraded",
                '<span class="badge degraded">degraded</span>' if t.get("degraded") else '<span class="ok">no</span>',
            ),
            ("LLM calls", _e(_num(usage.get("llm_calls", t.get("llm_calls"))))),
            (
                "tokens (prompt / completion)",
                f"{_e(_num(usage.get('prompt_tokens')))} / {_e(_num(usage.get('completion_tokens')))}",
            ),
            ("store calls", _e(_num(store_calls))),
            (
                "seconds",
                f'{_e(_secs(t.get("seconds")))} <span class="muted">(LLM {_e(_secs(usage.get("seconds")))})</span>',
            ),
        ]
        by_phase = _as_map(t.get("seconds_by_phase"))
        if by_phase:
            rows.append(("seconds by phase", ", ".join(f"{_e(k)} {_e(_secs(v))}" for k, v in by_phase.items())))
        if _int(t.get("unusable_outputs")) or _int(t.get("repairs")):
            bad, repairs = _int(t.get("unusable_outputs")), _int(t.get("repairs"))
            rows.append(("unusable LLM replies / repairs", f"{bad} / {repairs}"))
        qt = _as_map(self.qo.get("trace"))
        if qt:
            qo_calls = qt.get("store_calls")
            if qo_calls is None:
                qo_calls = sum(_int(_as_map(r).get("store_calls")) for r in _as_list(qt.get("rounds")))
            extra = ' <span class="badge degraded">degraded</span>' if qt.get("degraded") else ""
            rows.append(
                (
                    "query-only baseline",
                    f"{len(self.qo_facts)} facts, {_e(_num(qo_calls))} store calls, {_e(_secs(qt.get('seconds')))} s"
                    + extra,
                )
            )
        out = ['<table class="meta">']
        out += [f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows]
        out.append("</table>\n")
        errors = [str(e) for e in _as_list(t.get("errors"))] + [f"query-only: {e}" for e in _as_list(qt.get("errors"))]
        if t.get("degraded") or errors:
            heading = "Degraded result: partial, the LLM or store failed" if t.get("degraded") else "Errors"
            out.append(f'<div class="errors"><b>{heading}</b>')
            if errors:
                out.append("<ul>" + "".join(f"<li><code>{_e(e)}</code></li>" for e in errors) + "</ul>")
            out.append("</div>\n")
        return "".join(out)

    # ------------------------------------------------------------------ 2. tree

    def _tree(self) -> str:
        steps: dict[str, Mapping[str, Any]] = {}
        round_of: dict[str, int] = {}
        order: list[str] = []
        for i, rnd in enumerate(self.rounds):
            for s in _as_list(rnd.get("steps")):
                s = _as_map(s)
                sid = str(s.get("id"))
                if sid in steps:
                    continue
                steps[sid] = s
                round_of[sid] = _int(rnd.get("index", i))
                order.append(sid)
        head = "<h3>Prospection tree</h3>\n"
        if not steps:
            return head + '<p class="muted">No steps (no prospection ran, or the prospector gave none).</p>\n'

        # probes by step id (over all rounds), and dropped records by round + text
        hits_by_step: dict[str, int] = {}
        probed: set[str] = set()
        dropped_by_round: dict[int, dict[str, list[Mapping[str, Any]]]] = {}
        for i, rnd in enumerate(self.rounds):
            idx = _int(rnd.get("index", i))
            for pr in _as_list(rnd.get("probes")):
                pr = _as_map(pr)
                if pr.get("step_id") is not None:
                    sid = str(pr["step_id"])
                    probed.add(sid)
                    hits_by_step[sid] = hits_by_step.get(sid, 0) + len(_as_list(pr.get("hits")))
            for d in _as_list(rnd.get("dropped")):
                d = _as_map(d)
                dropped_by_round.setdefault(idx, {}).setdefault(str(d.get("text")), []).append(d)
        credited: dict[str, int] = {}
        for f in self.pgr_facts:
            if f.get("step_id") is not None and f.get("via", "hit") == "hit":
                credited[str(f["step_id"])] = credited.get(str(f["step_id"]), 0) + 1

        def dropped_record(sid: str) -> Mapping[str, Any] | None:
            if sid in probed:
                return None
            pool = dropped_by_round.get(round_of[sid], {}).get(str(steps[sid].get("text")))
            return pool[0] if pool else None

        children: dict[str, list[str]] = {sid: [] for sid in steps}
        for sid in order:  # the children lists first, in their order; then any child only its parent field names
            for c in _as_list(steps[sid].get("children")):
                c = str(c)
                if c in steps and c != sid and c not in children[sid]:
                    children[sid].append(c)
        for sid in order:
            parent = steps[sid].get("parent")
            if parent is not None and str(parent) in steps and sid not in children[str(parent)] and str(parent) != sid:
                children[str(parent)].append(sid)

        drawn: set[str] = set()

        def node(sid: str, home_round: int) -> str:
            drawn.add(sid)
            s = steps[sid]
            rec = dropped_record(sid)
            cls = "step dropped" if rec else "step"
            bits = [
                f'<li class="{cls}"><span class="sid">{_e(sid)}</span> <span class="stext">{_e(s.get("text"))}</span>'
            ]
            if s.get("dimension"):
                bits.append(f' <span class="tag">{_e(s.get("dimension"))}</span>')
            if round_of[sid] != home_round:
                bits.append(f' <span class="tag rnd">round {round_of[sid]}</span>')
            if rec:
                similar = f" — similar to “{_e(rec.get('similar_to'))}”" if rec.get("similar_to") else ""
                bits.append(f' <span class="badge drop">dropped: {_e(rec.get("reason"))}{similar}</span>')
            elif sid in probed:
                n = hits_by_step.get(sid, 0)
                bits.append(f' <span class="count{" zero" if n == 0 else ""}">{n} fact{"" if n == 1 else "s"}</span>')
                if credited.get(sid):
                    bits.append(f' <span class="count first">{credited[sid]} first found here</span>')
            else:
                bits.append(' <span class="muted">not probed</span>')
            parent = s.get("parent")
            if parent is not None and str(parent) not in steps:
                bits.append(f' <span class="muted">(parent {_e(parent)} not in trace)</span>')
            kids = [c for c in children[sid] if c not in drawn]
            if kids:
                bits.append("\n<ul>")
                for c in kids:
                    if c not in drawn:  # a child reached twice (bad links) is drawn once
                        bits.append(node(c, home_round))
                bits.append("</ul>")
            bits.append("</li>\n")
            return "".join(bits)

        roots_by_round: dict[int, list[str]] = {}
        for sid in order:
            parent = steps[sid].get("parent")
            if parent is None or str(parent) not in steps or str(parent) == sid:
                roots_by_round.setdefault(round_of[sid], []).append(sid)
        phase_of = {_int(r.get("index", i)): str(r.get("phase") or "") for i, r in enumerate(self.rounds)}
        out = [head, '<div class="tree">']
        for idx in sorted(roots_by_round):
            out.append(f'<div class="tround"><div class="thead">Round {idx} · {_e(phase_of.get(idx, ""))}</div><ul>')
            out += [node(sid, idx) for sid in roots_by_round[idx] if sid not in drawn]
            out.append("</ul></div>")
        left = [sid for sid in order if sid not in drawn]  # only a parent cycle leaves steps unreached
        if left:
            out.append('<div class="tround"><div class="thead">Steps in a parent cycle</div><ul>')
            out += [node(sid, round_of[sid]) for sid in left if sid not in drawn]
            out.append("</ul></div>")
        out.append("</div>\n")
        return "".join(out)

    # ------------------------------------------------------------------ 3. rounds table

    def _rounds_table(self) -> str:
        head = "<h3>Rounds</h3>\n"
        if not self.rounds:
            return head + '<p class="muted">No rounds.</p>\n'
        out = [
            head,
            '<table class="grid"><thead><tr><th>round</th><th>phase</th><th>probes</th><th>dropped</th>'
            "<th>new facts |Δ|</th><th>new neighbours</th><th>prompt held</th><th>kept</th><th>pruned</th>"
            "<th>store calls</th><th>prospect s</th><th>search s</th></tr></thead><tbody>",
        ]
        tot = [0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0]
        for i, r in enumerate(self.rounds):
            vals = [
                len(_as_list(r.get("probes"))),
                len(_as_list(r.get("dropped"))),
                len(_as_list(r.get("new_fact_ids"))),
                len(_as_list(r.get("new_neighbour_ids"))),
                len(_as_list(r.get("prompt_fact_ids"))),
                len(_as_list(r.get("kept"))),
                len(_as_list(r.get("pruned"))),
                _int(r.get("store_calls")),
                _float(r.get("prospect_seconds")),
                _float(r.get("search_seconds")),
            ]
            tot = [a + b for a, b in zip(tot, vals, strict=True)]
            phase = str(r.get("phase") or "")
            note = ' <span class="muted">(hits not counted)</span>' if phase == "augment" else ""
            if r.get("hygiene_fallback"):  # the embedder failed: probes were told apart by word overlap
                note += f' <span class="muted">(hygiene by word overlap: {_e(r.get("hygiene_fallback"))})</span>'
            out.append(
                f"<tr><td>{_int(r.get('index', i))}</td><td>{_e(phase)}{note}</td>"
                + "".join(f'<td class="n">{v}</td>' for v in vals[:8])
                + "".join(f'<td class="n">{_secs(v)}</td>' for v in vals[8:])
                + "</tr>"
            )
        out.append(
            '</tbody><tfoot><tr><th colspan="2">total</th>'
            + "".join(f'<td class="n">{v}</td>' for v in tot[:8])
            + "".join(f'<td class="n">{_secs(v)}</td>' for v in tot[8:])
            + "</tr></tfoot></table>\n"
        )
        return "".join(out)

    # ------------------------------------------------------------------ 4. probes and their hits

    def _probes(self) -> str:
        head = "<h3>What each probe found</h3>\n"
        if not self.rounds:
            return head + '<p class="muted">No probes.</p>\n'
        out = [head]
        for i, r in enumerate(self.rounds):
            idx = _int(r.get("index", i))
            phase = str(r.get("phase") or "")
            probes = [_as_map(p) for p in _as_list(r.get("probes"))]
            new_ids = {str(x) for x in _as_list(r.get("new_fact_ids"))}
            new_nb = {str(x) for x in _as_list(r.get("new_neighbour_ids"))}
            dropped = [_as_map(d) for d in _as_list(r.get("dropped"))]
            out.append(
                f'<details class="round" open><summary>Round {idx} · {_e(phase)} · {len(probes)} '
                f"probe{'' if len(probes) == 1 else 's'} · {len(new_ids)} new facts</summary>\n"
            )
            if phase == "augment":
                out.append('<p class="muted note">Augmentation lookup: its hits feed q_A and are not counted in R.</p>')
            for p in probes:
                src = str(p.get("source") or "")
                sid = f' <span class="sid">{_e(p.get("step_id"))}</span>' if p.get("step_id") is not None else ""
                out.append(
                    f'<div class="probe"><div class="ptext"><span class="tag src-{_e(src)}">{_e(src)}</span>{sid} '
                    f"{_e(p.get('text'))}</div>"
                )
                hits = _as_list(p.get("hits"))
                nbs = [str(x) for x in _as_list(p.get("neighbours"))]
                if not hits and not nbs:
                    out.append('<div class="muted none">no hits</div>')
                if hits:
                    out.append("<ol>")
                    for h in hits:
                        fid, score = _hit(h)
                        new = fid in new_ids and phase != "augment"
                        out.append(
                            f'<li class="{"new" if new else ""}">{self._fact_text(fid)} '
                            f'<span class="score">{_score(score)}</span>'
                            + (' <span class="badge new">new</span>' if new else "")
                            + self._marks(fid)
                            + "</li>"
                        )
                    out.append("</ol>")
                if nbs:
                    out.append('<div class="nbhead">window neighbours</div><ul class="nb">')
                    for fid in nbs:
                        new = fid in new_nb and phase != "augment"
                        out.append(
                            f'<li class="{"new" if new else ""}">{self._fact_text(fid)} '
                            '<span class="badge nbr">neighbour</span>'
                            + (' <span class="badge new">new</span>' if new else "")
                            + self._marks(fid)
                            + "</li>"
                        )
                    out.append("</ul>")
                out.append("</div>\n")
            for d in dropped:
                similar = f" — similar to “{_e(d.get('similar_to'))}”" if d.get("similar_to") else ""
                out.append(
                    f'<div class="probe dropped"><span class="badge drop">dropped: {_e(d.get("reason"))}</span> '
                    f'<span class="stext">{_e(d.get("text"))}</span>{similar}</div>\n'
                )
            out.append("</details>\n")
        return "".join(out)

    # ------------------------------------------------------------------ 5. side by side

    def _side_by_side(self) -> str:
        rel, rel_set = self.relevant, self.relevant_set
        n = self.budget
        out = [f"<h3>Query-only vs PGR, {n} facts each</h3>\n"]
        only = self.head_ids - self.qo_ids
        if rel:
            qo_n = len(rel_set & self.qo_ids)
            pgr_n = len(rel_set & self.head_ids)
            out.append(
                f'<p class="counts">Relevant found in {n} facts: query-only <b>{qo_n}/{len(rel)}</b> · '
                f"PGR <b>{pgr_n}/{len(rel)}</b> · only PGR found "
                f"<b>{len(only)}</b> facts ({len(only & rel_set)} relevant) · all of R* ({len(self.pgr_facts)} "
                f"facts): {len(rel_set & self.pgr_ids)}/{len(rel)}</p>\n"
            )
        else:
            out.append(f'<p class="counts">No relevant facts given · only PGR found <b>{len(only)}</b> facts</p>\n')
        out.append('<div class="cols">')
        out.append(self._column(f"Query-only ({len(self.qo_facts)})", self.qo_facts, pgr_side=False))
        out.append(
            self._column(f"PGR (first {len(self.pgr_head)} of {len(self.pgr_facts)})", self.pgr_head, pgr_side=True)
        )
        out.append("</div>\n")
        rest = self.pgr_facts[n:]
        if rest:
            out.append(f'<details class="round"><summary>The rest of R* ({len(rest)} facts, past the budget)</summary>')
            out.append(self._column(f"Past the budget ({len(rest)})", rest, pgr_side=True) + "</details>\n")
        missed = [r for r in rel if r not in self.head_ids and r not in self.qo_ids]
        if missed:
            out.append('<div class="missed"><b>Relevant, found by neither</b><ul>')
            for fid in missed:
                why = f' <span class="why">— {_e(self.why[fid])}</span>' if self.why.get(fid) else ""
                out.append(f'<li><span class="rel">✓</span> {self._fact_text(fid)}{why}</li>')
            out.append("</ul></div>\n")
        return "".join(out)

    def _column(self, heading: str, facts: list[Mapping[str, Any]], *, pgr_side: bool) -> str:
        out = [f'<div class="col"><h4>{_e(heading)}</h4>']
        if not facts:
            out.append('<p class="muted">No facts.</p></div>')
            return "".join(out)
        out.append("<ol>")
        for f in facts:
            fid = str(f.get("id"))
            only = pgr_side and fid not in self.qo_ids
            missing_in_pgr = not pgr_side and fid not in self.head_ids
            flags = (("only-pgr", only), ("relevant", fid in self.relevant_set), ("qo-only", missing_in_pgr))
            cls = " ".join(c for c, on in flags if on)
            meta = [f'<span class="score">{_score(f.get("score"))}</span>']
            meta.append(f'<span class="tag">via {_e(f.get("via") or "hit")}</span>')
            meta.append(f'<span class="tag">round {_e(f.get("round"))}</span>')
            if f.get("cue"):
                meta.append(f'<span class="tag cue">through the cue &ldquo;{_e(f.get("cue"))}&rdquo;</span>')
            if f.get("date"):
                meta.append(f'<span class="muted">{_e(f.get("date"))}</span>')
            probe = f.get("probe")
            tip = f' title="probe: {_e(probe)}"' if probe else ""
            out.append(
                f'<li class="{cls}"{tip}><span class="ftext">{_e(f.get("text"))}</span>'
                f' <span class="fid">{_e(fid)}</span>'
                + (' <span class="badge only">only PGR</span>' if only else "")
                + (' <span class="badge qo">not in PGR</span>' if missing_in_pgr else "")
                + self._marks(fid)
                + f'<div class="fmeta">{" ".join(meta)}</div></li>'
            )
        out.append("</ol></div>")
        return "".join(out)

    # ------------------------------------------------------------------ 6. summary

    def _summary(self) -> str:
        text = str(self.pgr.get("summary") or "").strip()
        body = f'<div class="summary">{_e(text)}</div>' if text else '<p class="muted">No summary.</p>'
        return f"<h3>Prospection summary</h3>\n{body}\n"

    # ------------------------------------------------------------------ helpers

    def _fact_text(self, fid: str) -> str:
        f = self.texts.get(fid)
        if f is None or f.get("text") is None:
            return f'<span class="fid">{_e(fid)}</span>'
        return f'<span class="ftext">{_e(f.get("text"))}</span> <span class="fid">{_e(fid)}</span>'

    def _marks(self, fid: str) -> str:
        out = ""
        if fid in self.relevant_set:
            why = f' <span class="why">— {_e(self.why[fid])}</span>' if self.why.get(fid) else ""
            out += f' <span class="rel" title="relevant">✓</span>{why}'
        return out


# ====================================================================== small helpers


def _as_map(x: Any) -> Mapping[str, Any]:
    if x is None:
        return {}
    if isinstance(x, Mapping):
        return x
    to_dict = getattr(x, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    return {}


def _as_list(x: Any) -> list[Any]:
    if x is None or isinstance(x, str | bytes | Mapping):
        return []
    return list(x) if isinstance(x, Iterable) else []


def _e(x: Any) -> str:
    return "" if x is None else html.escape(str(x), quote=True)


def _int(x: Any) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return 0


def _float(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return 0.0


def _num(x: Any) -> str:
    return "—" if x is None else str(x)


def _secs(x: Any) -> str:
    try:
        return f"{float(x):.2f}"
    except (TypeError, ValueError):
        return "—"


def _score(x: Any) -> str:
    try:
        return f"{float(x):.3f}"
    except (TypeError, ValueError):
        return "—"


def _hit(h: Any) -> tuple[str, Any]:
    """A probe hit as (fact id, score): a (id, score) pair from the trace, or an id alone."""
    if isinstance(h, list | tuple) and h:
        return str(h[0]), (h[1] if len(h) > 1 else None)
    if isinstance(h, Mapping):
        return str(h.get("id")), h.get("score")
    return str(h), None


_LEGEND = (
    '<div class="legend"><b>Legend</b> '
    '<span class="badge new">new</span> first found in that round · '
    '<span class="swatch only-pgr">&nbsp;</span><span class="badge only">only PGR</span> not in the query-only list · '
    '<span class="rel">✓</span> known relevant (reason after it) · '
    '<span class="badge drop">dropped</span> probe removed by hygiene · '
    '<span class="badge nbr">neighbour</span> brought in by the temporal window · '
    '<span class="badge degraded">degraded</span> the LLM or store failed; partial result'
    "</div>\n"
)

_CSS = """
:root { --fg:#1f2328; --muted:#6a737d; --line:#d8dee4; --bg:#fff; --soft:#f6f8fa;
  --green:#1a7f37; --greenbg:#e6f4ea; --blue:#0b5cad; --bluebg:#e7f0fb; --red:#b42318; --redbg:#fdecea;
  --amber:#8a5300; --amberbg:#fff4dc; }
* { box-sizing:border-box; }
body { font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif; color:var(--fg);
  background:var(--bg); margin:0 auto; padding:1.5rem 2rem 4rem; max-width:1200px; line-height:1.45; font-size:14px; }
h1 { font-size:1.5rem; margin:0 0 .75rem; }
h2 { font-size:1.2rem; margin:0 0 .75rem; }
h3 { font-size:1rem; margin:1.4rem 0 .5rem; border-bottom:1px solid var(--line); padding-bottom:.2rem; }
h4 { margin:.2rem 0 .4rem; font-size:.95rem; }
code { font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; font-size:.9em; }
.muted { color:var(--muted); }
.ok { color:var(--green); }
.legend { background:var(--soft); border:1px solid var(--line); border-radius:6px; padding:.5rem .75rem;
  margin-bottom:1rem; font-size:.85rem; }
.swatch { display:inline-block; width:1em; height:1em; vertical-align:middle; border-radius:2px; margin-right:2px; }
.swatch.only-pgr { background:var(--greenbg); border:1px solid var(--green); }
.toc ol { margin:.3rem 0 1rem; }
section.query { border:1px solid var(--line); border-radius:8px; padding:1rem 1.25rem; margin:1rem 0 2rem; }
.qn { color:var(--muted); font-weight:normal; margin-right:.3rem; }
table { border-collapse:collapse; }
table.meta th { text-align:left; font-weight:600; color:var(--muted); padding:.1rem 1rem .1rem 0; vertical-align:top; }
table.meta td { padding:.1rem 0; }
table.grid { width:100%; font-size:.9rem; }
table.grid th, table.grid td { border:1px solid var(--line); padding:.25rem .5rem; text-align:left; }
table.grid thead th, table.grid tfoot th { background:var(--soft); }
table.grid td.n { text-align:right; font-variant-numeric:tabular-nums; }
.errors { background:var(--amberbg); border:1px solid #f0c36d; color:var(--amber); border-radius:6px;
  padding:.5rem .75rem; margin:.6rem 0; }
.errors ul { margin:.3rem 0 0; }
.badge { display:inline-block; font-size:.75rem; padding:0 .4rem; border-radius:9px; border:1px solid transparent;
  white-space:nowrap; }
.badge.new { background:var(--bluebg); color:var(--blue); border-color:#b6cff0; }
.badge.only { background:var(--greenbg); color:var(--green); border-color:#a7d7b5; }
.badge.qo { background:var(--soft); color:var(--muted); border-color:var(--line); }
.badge.drop { background:var(--redbg); color:var(--red); border-color:#f3b8b1; }
.badge.nbr { background:var(--soft); color:var(--muted); border-color:var(--line); font-style:italic; }
.badge.degraded { background:var(--amberbg); color:var(--amber); border-color:#f0c36d; }
.tag { display:inline-block; font-size:.75rem; color:var(--muted); background:var(--soft); border-radius:3px;
  padding:0 .3rem; }
.sid, .fid { font-family:ui-monospace,Menlo,Consolas,monospace; font-size:.75rem; color:var(--muted); }
.rel { color:var(--green); font-weight:700; }
.why { color:var(--green); font-size:.85rem; }
.score { font-family:ui-monospace,Menlo,Consolas,monospace; font-size:.8rem; color:var(--muted); }
.count { font-size:.75rem; color:var(--blue); }
.count.zero { color:var(--muted); }
.count.first { color:var(--green); }
.tree .tround { margin:.3rem 0 .6rem; }
.tree .thead { font-weight:600; font-size:.85rem; color:var(--muted); }
.tree ul { list-style:none; margin:.1rem 0; padding-left:1.2rem; border-left:1px dashed var(--line); }
.tree li { margin:.15rem 0; }
.tree li.dropped > .stext { text-decoration:line-through; color:var(--muted); }
details.round { border:1px solid var(--line); border-radius:6px; margin:.5rem 0; padding:.3rem .75rem; }
details.round > summary { cursor:pointer; font-weight:600; }
.probe { margin:.5rem 0 .5rem .25rem; padding-left:.6rem; border-left:3px solid var(--line); }
.probe.dropped { border-left-color:#f3b8b1; color:var(--muted); }
.probe.dropped .stext { text-decoration:line-through; }
.ptext { font-weight:500; }
.probe ol, .probe ul { margin:.2rem 0; padding-left:1.6rem; }
.probe li.new { background:var(--bluebg); border-radius:3px; }
.nbhead { font-size:.75rem; color:var(--muted); margin-top:.2rem; }
.none, .note { font-size:.85rem; }
.counts { margin:.3rem 0 .6rem; }
.cols { display:grid; grid-template-columns:1fr 1fr; gap:1rem; }
.col { background:var(--soft); border-radius:6px; padding:.5rem .75rem; min-width:0; }
.col ol { padding-left:1.6rem; margin:0; }
.col li { margin:.3rem 0; padding:.15rem .3rem; border-radius:4px; }
.col li.only-pgr { background:var(--greenbg); }
.col li.relevant { outline:1px solid var(--green); }
.col li.qo-only { opacity:.85; }
.fmeta { font-size:.75rem; }
.fmeta > * { margin-right:.35rem; }
.missed { margin-top:.6rem; font-size:.9rem; }
.summary { white-space:pre-wrap; background:var(--soft); border-radius:6px; padding:.6rem .8rem; }
@media (max-width:800px) { .cols { grid-template-columns:1fr; } body { padding:1rem; } }
"""
