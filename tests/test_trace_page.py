"""pgr_core.observability.trace_page: the HTML trace page, checked on its parsed structure and escaped text."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

import pytest

from pgr_core.observability.trace import DroppedProbe, FoundFact, Probe, RetrievalResult, Round, Step, Trace, Usage
from pgr_core.observability.trace_page import trace_page, write_trace_page
from pgr_core.types import Fact, Scope

SCOPE = Scope(user_id="u1")
XSS = "<script>alert(1)</script>"

# ====================================================================== a tiny DOM over html.parser

_VOID = {"meta", "br", "hr", "img", "input", "link", "wbr", "col", "area", "base", "source"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    parent: Node | None = None
    children: list[Node | str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def own_text(self) -> str:
        """Text of this element without that of nested lists (a tree node's own label)."""
        return "".join(
            c if isinstance(c, str) else ("" if c.tag in ("ul", "ol") else c.own_text()) for c in self.children
        )

    def iter(self):
        for c in self.children:
            if isinstance(c, Node):
                yield c
                yield from c.iter()

    def find_all(self, tag: str, cls: str | None = None) -> list[Node]:
        return [n for n in self.iter() if n.tag == tag and (cls is None or cls in n.classes)]

    def ancestors(self, tag: str) -> list[Node]:
        out, n = [], self.parent
        while n is not None:
            if n.tag == tag:
                out.append(n)
            n = n.parent
        return out


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {})
        self.cur = self.root

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs}, parent=self.cur)
        self.cur.children.append(node)
        if tag not in _VOID:
            self.cur = node

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, {k: v or "" for k, v in attrs}, parent=self.cur))

    def handle_endtag(self, tag):
        if tag in _VOID:
            return
        assert self.cur.tag == tag, f"</{tag}> closes <{self.cur.tag}>"
        self.cur = self.cur.parent

    def handle_data(self, data):
        self.cur.children.append(data)


def parse(page: str) -> Node:
    b = _Builder()
    b.feed(page)
    b.close()
    assert b.cur is b.root, f"unclosed <{b.cur.tag}>"
    return b.root


def li_with_label(dom: Node, text: str) -> Node:
    found = [li for li in dom.find_all("li") if text in li.own_text()]
    assert found, f"no <li> labelled {text!r}"
    return found[0]


def meta_rows(dom: Node) -> dict[str, Node]:
    """The header table of the first query: label -> its value cell."""
    return {tr.find_all("th")[0].text(): tr.find_all("td")[0] for tr in dom.find_all("table", "meta")[0].find_all("tr")}


def section(dom: Node, heading: str) -> list[Node]:
    """The elements after the <h3> named ``heading`` up to the next <h3>, in the first query section."""
    sec = dom.find_all("section")[0]
    nodes = [c for c in sec.children if isinstance(c, Node)]
    start = next(i for i, n in enumerate(nodes) if n.tag == "h3" and heading in n.text())
    out = []
    for n in nodes[start + 1 :]:
        if n.tag == "h3":
            break
        out.append(n)
    return out


# ====================================================================== fixtures built by hand


def fact(fid: str, text: str) -> Fact:
    return Fact(id=fid, text=text, scope=SCOPE)


F1 = fact("f1", "Alice tore her ACL in March")
F2 = fact("f2", f"Alice said {XSS} about soccer")
F3 = fact("f3", "Alice's physio said no contact sports until autumn")
F4 = fact("f4", "Alice booked physio sessions every Tuesday")
F5 = fact("f5", "Alice likes watching soccer on TV")
F9 = fact("f9", "Alice lives in Lyon")


def found(f: Fact, score: float, rnd: int, probe: str, step_id: str | None = None, via: str = "hit") -> FoundFact:
    return FoundFact(fact=f, score=score, rank_score=score / 10, round=rnd, probe=probe, step_id=step_id, via=via)


QUERY = "Should I join a soccer league this summer?"


def pgr_result(*, degraded: bool = False, augment: bool = True) -> RetrievalResult:
    """An LLM ToT trace: [round 0 augment,] then the initial round and one personalised round."""
    base = 1 if augment else 0
    root = Step("r1.1", "health and injuries", dimension="health", children=["r1.2"], round=base)
    child = Step("r1.2", "recovery timeline for the knee", dimension="health", parent="r1.1", round=base)
    dup = Step("r1.3", "health and injuries", dimension="health", round=base)
    grandchild = Step("r2.1", "physio appointments", dimension="schedule", parent="r1.2", round=base + 1)
    child.children.append("r2.1")
    other_root = Step("r2.2", "weekend commitments", dimension="schedule", round=base + 1)
    rounds = []
    if augment:
        rounds.append(
            Round(index=0, phase="augment", probes=[Probe(QUERY, "query", hits=[("f9", 0.71)])], store_calls=1)
        )
    rounds.append(
        Round(
            index=base,
            phase="initial",
            steps=[root, child, dup],
            probes=[
                Probe(QUERY, "query", hits=[("f1", 0.61), ("f2", 0.55)]),
                Probe(root.text, "step", step_id="r1.1", hits=[("f1", 0.50)]),
                Probe(child.text, "step", step_id="r1.2", hits=[("f3", 0.58), ("f1", 0.40)], neighbours=["f4"]),
            ],
            dropped=[DroppedProbe("health and injuries", "duplicate", similar_to="health and injuries")],
            new_fact_ids=["f1", "f2", "f3"],
            new_neighbour_ids=["f4"],
            store_calls=1,
            prospect_seconds=1.25,
            search_seconds=0.05,
        )
    )
    rounds.append(
        Round(
            index=base + 1,
            phase="personalized",
            steps=[grandchild, other_root],
            probes=[
                Probe(grandchild.text, "step", step_id="r2.1", hits=[("f3", 0.52), ("f-unknown", 0.33)]),
                Probe(other_root.text, "step", step_id="r2.2"),
            ],
            new_fact_ids=[],
            store_calls=1,
            prospect_seconds=0.75,
            search_seconds=0.04,
        )
    )
    trace = Trace(
        query=QUERY,
        strategy="tot",
        prospector="llm",
        date="2025-05-01",
        intent="Is a summer soccer league right for Alice given her health?",
        rounds=rounds,
        stop_reason="delta_below_threshold",
        usage=Usage(llm_calls=4, prompt_tokens=1234, completion_tokens=567, seconds=2.5),
        seconds_by_phase={"initial": 1.3, "personalized": 0.8},
        seconds=3.0,
    )
    if degraded:
        trace.degrade("llm_error", RuntimeError("server said <b>503</b>"))
    facts = [
        found(F1, 0.61, base, QUERY),
        found(F3, 0.58, base, child.text, "r1.2"),
        found(F2, 0.55, base, QUERY),
        found(F4, 0.0, base, child.text, "r1.2", via="neighbour"),
    ]
    return RetrievalResult(facts=facts, summary=f"Step r1.2 surfaced the injury. {XSS}", trace=trace)


def qo_result() -> RetrievalResult:
    trace = Trace(query=QUERY, strategy="query-only", prospector="none", date="2025-05-01")
    trace.rounds.append(
        Round(
            index=0, phase="query_only", probes=[Probe(QUERY, "query")], new_fact_ids=["f1", "f2", "f5"], store_calls=1
        )
    )
    trace.stop_reason = "query_only"
    facts = [found(F1, 0.61, 0, QUERY), found(F2, 0.55, 0, QUERY), found(F5, 0.42, 0, QUERY)]
    return RetrievalResult(facts=facts, summary="", trace=trace)


def item(pgr: RetrievalResult | None = None, **kw) -> dict:
    out = {
        "query": QUERY,
        "date": "2025-05-01",
        "query_only": qo_result().to_dict(),
        "pgr": (pgr or pgr_result()).to_dict(),
        "relevant": ["f3"],
        "why": {"f3": "the knee rules out contact sport this summer"},
    }
    out.update(kw)
    return out


@pytest.fixture(scope="module")
def page() -> str:
    return trace_page([item()])


@pytest.fixture(scope="module")
def dom(page: str) -> Node:
    return parse(page)


# ====================================================================== the page as a whole


def test_page_is_one_well_formed_self_contained_document(page: str, dom: Node) -> None:
    assert page.startswith("<!DOCTYPE html>")
    assert [n.tag for n in dom.find_all("style")] == ["style"]
    assert not dom.find_all("script")
    assert not dom.find_all("link") and not dom.find_all("img")
    assert "http://" not in page and "https://" not in page
    assert dom.find_all("title")[0].text() == "pgr prospection trace"
    assert len(dom.find_all("section")) == 1
    assert dom.find_all("div", "legend")


def test_header_shows_usage_and_stop_reason(dom: Node) -> None:
    rows = {k: v.text() for k, v in meta_rows(dom).items()}
    assert rows["date"] == "2025-05-01"
    assert rows["prospector / strategy"] == "llm / tot"
    assert rows["stop reason"] == "delta_below_threshold"
    assert rows["degraded"] == "no"
    assert rows["LLM calls"] == "4"
    assert rows["tokens (prompt / completion)"] == "1234 / 567"
    assert rows["store calls"] == "3"
    assert rows["seconds"].startswith("3.00")
    assert "initial 1.30" in rows["seconds by phase"]
    assert rows["intent (q_A)"].startswith("Is a summer soccer league")
    assert rows["query-only baseline"].startswith("3 facts, 1 store calls")
    assert not dom.find_all("div", "errors")


# ====================================================================== the tree


def test_tree_nests_children_under_their_parents(dom: Node) -> None:
    tree = dom.find_all("div", "tree")[0]
    root = li_with_label(tree, "health and injuries")
    child = li_with_label(tree, "recovery timeline for the knee")
    grandchild = li_with_label(tree, "physio appointments")
    # the child's <li> sits in a <ul> inside the parent's <li>; the round-2 step sits under its round-1 parent
    assert child.parent.tag == "ul" and child.parent.parent is root
    assert grandchild.parent.parent is child
    assert root in grandchild.ancestors("li")
    assert "round 2" in grandchild.own_text()  # drawn under a step of another round, so tagged
    # roots: r1.1 and the dropped duplicate r1.3 under round 1's heading; r2.2 under round 2's
    groups = {g.find_all("div", "thead")[0].text(): g for g in tree.find_all("div", "tround")}
    assert list(groups) == ["Round 1 · initial", "Round 2 · personalized"]
    top = [li.own_text() for li in groups["Round 1 · initial"].find_all("ul")[0].children if isinstance(li, Node)]
    assert len(top) == 2 and all("health and injuries" in t for t in top)
    assert "weekend commitments" in groups["Round 2 · personalized"].text()
    assert not li_with_label(tree, "weekend commitments").ancestors("li")


def test_tree_counts_probe_hits_and_marks_dropped_steps(dom: Node) -> None:
    tree = dom.find_all("div", "tree")[0]
    labels = [li.own_text() for li in tree.find_all("li")]
    kept = next(t for t in labels if t.startswith("r1.1"))
    child = next(t for t in labels if t.startswith("r1.2"))
    dup = next(t for t in labels if t.startswith("r1.3"))
    empty = next(t for t in labels if t.startswith("r2.2"))
    assert "1 fact" in kept and "dropped" not in kept
    assert "2 facts" in child and "1 first found here" in child
    assert "dropped: duplicate" in dup and "similar to “health and injuries”" in dup
    assert "0 facts" in empty
    assert "dropped" in li_with_label(tree, "r1.3").classes
    assert "dropped" not in li_with_label(tree, "r1.1").classes


# ====================================================================== rounds and probes


def test_rounds_table(dom: Node) -> None:
    table = next(n for n in section(dom, "Rounds") if n.tag == "table")
    body = table.find_all("tbody")[0]
    rows = [[td.text() for td in tr.children if isinstance(td, Node)] for tr in body.find_all("tr")]
    assert rows == [
        ["0", "augment (hits not counted)", "1", "0", "0", "0", "0", "0", "0", "1", "0.00", "0.00"],
        ["1", "initial", "3", "1", "3", "1", "0", "0", "0", "1", "1.25", "0.05"],
        ["2", "personalized", "2", "0", "0", "0", "0", "0", "0", "1", "0.75", "0.04"],
    ]
    total = [c.text() for c in table.find_all("tfoot")[0].find_all("tr")[0].children if isinstance(c, Node)]
    assert total == ["total", "6", "1", "3", "1", "0", "0", "0", "3", "2.00", "0.09"]


def test_a_round_whose_hygiene_fell_back_says_so_in_the_rounds_table() -> None:
    result = pgr_result(augment=False)
    result.trace.rounds[1].hygiene_fallback = "RuntimeError: embedding server down <b>"
    dom = parse(trace_page([item(result)]))
    table = next(n for n in section(dom, "Rounds") if n.tag == "table")
    phases = [tr.find_all("td")[1].text() for tr in table.find_all("tbody")[0].find_all("tr")]
    assert phases == ["initial", "personalized (hygiene by word overlap: RuntimeError: embedding server down <b>)"]


def test_probes_list_their_hits_with_texts_scores_and_new_marks(dom: Node) -> None:
    rounds = [n for n in section(dom, "What each probe found") if n.tag == "details"]
    assert len(rounds) == 3
    _augment, first, second = rounds
    probes = first.find_all("div", "probe")
    child_probe = next(p for p in probes if "recovery timeline for the knee" in p.text())
    hits = child_probe.find_all("ol")[0].find_all("li")
    assert "no contact sports" in hits[0].text() and "0.580" in hits[0].text()
    assert "new" in hits[0].classes and "✓" in hits[0].text()
    assert "booked physio" in child_probe.find_all("ul", "nb")[0].text()  # the window neighbour, new this round
    # round 2 finds f3 again: not new there; an id with no known fact falls back to the id
    later = second.find_all("div", "probe")[0].find_all("li")
    assert "no contact sports" in later[0].text() and "new" not in later[0].classes
    assert later[1].text().startswith("f-unknown")
    assert "no hits" in second.find_all("div", "probe")[1].text()
    dropped = first.find_all("div", "dropped")
    assert len(dropped) == 1 and "dropped: duplicate" in dropped[0].text()


def test_augment_round_hits_are_not_marked_new(dom: Node) -> None:
    aug = dom.find_all("details", "round")[0]
    assert aug.find_all("summary")[0].text().startswith("Round 0 · augment")
    assert "not counted" in aug.text()
    hit = aug.find_all("li")[0]
    assert "lives in Lyon" not in hit.text()  # f9 is in neither list: the id stands in for the text
    assert hit.text().startswith("f9") and "new" not in hit.classes


def test_trace_without_augment_round() -> None:
    dom = parse(trace_page([item(pgr_result(augment=False))]))
    groups = [g.text() for g in dom.find_all("div", "thead")]
    assert groups == ["Round 0 · initial", "Round 1 · personalized"]
    child = li_with_label(dom, "physio appointments")
    assert li_with_label(dom, "recovery timeline for the knee") in child.ancestors("li")
    assert "augment" not in dom.find_all("table", "grid")[0].text()


# ====================================================================== side by side


def test_side_by_side_marks_only_pgr_and_relevant_facts(dom: Node) -> None:
    cols = dom.find_all("div", "col")  # both lists at the query-only list's size, then the rest of R*
    assert [c.find_all("h4")[0].text() for c in cols] == ["Query-only (3)", "PGR (first 3 of 4)", "Past the budget (1)"]
    qo, pgr = cols[0].find_all("li"), cols[1].find_all("li") + cols[2].find_all("li")
    only = [li for li in pgr if "only-pgr" in li.classes]
    assert {li.find_all("span", "fid")[0].text() for li in only} == {"f3", "f4"}
    f3 = next(li for li in pgr if "physio said" in li.text())
    assert "only PGR" in f3.text() and "relevant" in f3.classes
    assert "✓" in f3.text() and "the knee rules out contact sport this summer" in f3.text()
    assert "via hit" in f3.text() and "round 1" in f3.text() and "0.580" in f3.text()
    f4 = next(li for li in pgr if "booked physio" in li.text())
    assert "via neighbour" in f4.text()
    f1 = next(li for li in pgr if "tore her ACL" in li.text())
    assert "only-pgr" not in f1.classes and "only PGR" not in f1.text() and "✓" not in f1.text()
    assert "not in PGR" in next(li for li in qo if "watching soccer" in li.text()).text()
    counts = dom.find_all("p", "counts")[0].text()
    assert "query-only 0/1" in counts and "PGR 1/1" in counts


def test_relevant_facts_nobody_found_are_listed() -> None:
    dom = parse(trace_page([item(relevant=["f3", "f7"], why={"f7": "she moved"})]))
    missed = dom.find_all("div", "missed")[0].text()
    assert "f7" in missed and "she moved" in missed and "f3" not in missed
    assert "PGR 1/2" in dom.find_all("p", "counts")[0].text()


def test_summary_is_shown(dom: Node) -> None:
    assert dom.find_all("div", "summary")[0].text() == f"Step r1.2 surfaced the injury. {XSS}"


# ====================================================================== escaping, degraded, empty


def test_user_text_is_escaped_everywhere() -> None:
    r = pgr_result(degraded=True)
    r.trace.rounds[1].steps[0].text = f"step {XSS}"
    r.trace.rounds[1].dropped[0].similar_to = f"sim {XSS}"
    r.trace.errors.append(f"err {XSS}")
    page = trace_page(
        [item(r, query=f"q {XSS}", why={"f3": f"why {XSS}"}, relevant=["f3", f"id{XSS}"])], title=f"t {XSS}"
    )
    assert XSS not in page
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    dom = parse(page)  # and the escaped text reads back as the original
    assert not dom.find_all("script")
    assert f"Alice said {XSS} about soccer" in dom.text()
    assert f"t {XSS}" == dom.find_all("title")[0].text()
    assert f"why {XSS}" in dom.text() and f"err {XSS}" in dom.text() and f"sim {XSS}" in dom.text()


def test_degraded_result_shows_flag_and_errors() -> None:
    dom = parse(trace_page([item(pgr_result(degraded=True))]))
    rows = meta_rows(dom)
    assert rows["degraded"].text() == "degraded" and rows["degraded"].find_all("span", "degraded")
    assert rows["stop reason"].text() == "llm_error"
    errors = dom.find_all("div", "errors")
    assert len(errors) == 1 and "Degraded" in errors[0].text()
    assert "RuntimeError: server said <b>503</b>" in errors[0].text()  # shown as text, not markup
    assert not errors[0].find_all("b")[1:]  # the only <b> is the heading


def test_empty_results_render() -> None:
    def empty(strategy: str) -> RetrievalResult:
        return RetrievalResult(facts=[], summary="", trace=Trace(query="q", strategy=strategy, prospector="none"))

    page = trace_page(
        [
            {
                "query": "q",
                "date": None,
                "query_only": empty("query-only").to_dict(),
                "pgr": empty("tot").to_dict(),
                "relevant": [],
            }
        ]
    )
    dom = parse(page)
    text = dom.text()
    assert "No steps" in text and "No rounds." in text and "No probes." in text
    assert "No facts." in text and "No summary." in text and "No relevant facts given" in text
    assert len(dom.find_all("div", "col")) == 2
    # not even the optional parts of an item are required
    assert "No facts." in parse(trace_page([{"query": "bare"}])).text()
    assert "No queries." in parse(trace_page([])).text()


def test_several_queries_get_a_table_of_contents() -> None:
    dom = parse(trace_page([item(), item(query="Second one?")]))
    assert [s.attrs["id"] for s in dom.find_all("section")] == ["q1", "q2"]
    assert [a.attrs["href"] for a in dom.find_all("nav")[0].find_all("a")] == ["#q1", "#q2"]


def test_result_objects_render_like_their_dicts() -> None:
    as_dicts = trace_page([item()])
    as_objects = trace_page([item() | {"pgr": pgr_result(), "query_only": qo_result()}])
    assert as_objects == as_dicts


def test_write_trace_page(tmp_path) -> None:
    path = write_trace_page(tmp_path / "out" / "trace.html", [item()], title="my ✓ page")
    assert path == tmp_path / "out" / "trace.html"
    data = path.read_bytes().decode("utf-8")
    assert data == trace_page([item()], title="my ✓ page")
    assert "<title>my ✓ page</title>" in data


def test_the_module_docstring_example_runs(tmp_path, monkeypatch) -> None:
    """The trace page module's own example, run as a doctest: it writes trace.html in the cwd."""
    import doctest

    import pgr_core.observability.trace_page

    monkeypatch.chdir(tmp_path)
    outcome = doctest.testmod(pgr_core.observability.trace_page)
    assert outcome.attempted >= 8 and outcome.failed == 0
    dom = parse((tmp_path / "trace.html").read_text(encoding="utf-8"))
    text = dom.text()
    assert "Should I join a soccer league this summer?" in text
    assert "I twisted my knee playing football in March" in text
    assert "the knee injury rules out contact sport" in text


def test_a_fact_found_through_a_cue_names_the_cue_escaped() -> None:
    data = item()
    data["pgr"]["facts"][0]["cue"] = 'should I join a league? <b>"now"</b>'
    page = trace_page([data])
    assert "through the cue &ldquo;should I join a league? &lt;b&gt;&quot;now&quot;&lt;/b&gt;&rdquo;" in page
    assert "through the cue" not in trace_page([item()])


def test_header_says_whether_the_scores_were_centred() -> None:
    centred_run = pgr_result()
    centred_run.trace.centring = 1.0
    rows = {k: v.text() for k, v in meta_rows(parse(trace_page([item(centred_run)]))).items()}
    assert rows["scores"] == "centred on the user's memory (w = 1.0)"
    plain = pgr_result()
    plain.trace.centring_off = "CentringUnavailable: SearchOnly cannot list a scope's facts (no facts_for)"
    rows = {k: v.text() for k, v in meta_rows(parse(trace_page([item(plain)]))).items()}
    assert rows["scores"].startswith("not centred: CentringUnavailable")
    rows = {k: v.text() for k, v in meta_rows(parse(trace_page([item()]))).items()}
    assert "scores" not in rows  # an older trace says nothing of centring: the page says nothing either
