"""Faults of the write side: two writers on one store, a failed or interrupted checkpoint, corrupt or torn
ledgers and journals, reruns that reword an extraction, consolidation run again (a fixed point, the
7-day window over a merged fact's whole span), merges across owners, and ambiguous generated keys."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pgr_core import HashingEmbedder, InMemoryStore, Scope
from pgr_core.cli.main import main
from pgr_core.errors import ConfigurationError
from pgr_core.testing import ScriptedLLM
from pgr_core.types import Fact
from pgr_core.write import Consolidator, Ingestor, Journal, Ledger, LedgerEntry, Session, Turn, raw_facts
from pgr_core.write.ingest import SESSION_KEY
from pgr_core.write.ledger import SqliteLedger, ledger_path_for, open_ledger
from pgr_core.write.sessions import scope_label

U = Scope(user_id="u1")


def _store() -> InMemoryStore:
    return InMemoryStore(embedder=HashingEmbedder())


def _sessions(n: int, user: str = "u") -> list[Session]:
    return [
        Session(f"s{i}", f"2025-01-{i + 1:02d}", [Turn("user", f"{user} note number {i} about topic {i}")])
        for i in range(n)
    ]


def _ids(store: InMemoryStore) -> list[str]:
    return sorted(f.id for f in store.facts)


def _assert_ledger_matches_store(ledger: Ledger, store: InMemoryStore) -> None:
    """Every session the ledger lists done is in the store, each of its facts exactly once."""
    facts = store.facts
    assert len({(f.scope, f.id) for f in facts}) == len(facts)
    for entry in ledger.entries():
        if entry.status == "failed":
            continue
        owner = Scope(*entry.owner) if entry.owner else Scope(user_id=entry.scope)
        written = sorted(f.id for f in facts if f.scope == owner and f.metadata.get(SESSION_KEY) == entry.session)
        assert written == sorted(entry.facts), f"{entry.scope}/{entry.session}: ledger {entry.facts}, store {written}"


# =========================================================================== 1. two writers, commit order


def _jsonl(path: Path, users: Mapping[str, int]) -> Path:
    lines = []
    for user, n in users.items():
        sessions = [
            {"id": f"s{i}", "date": f"2025-02-{i + 1:02d}", "turns": [{"text": f"{user} says thing {i} today"}]}
            for i in range(n)
        ]
        lines.append(json.dumps({"user_id": user, "sessions": sessions}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _ingest_cmd(data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "ingest",
        "jsonl",
        "--data",
        str(data),
        "--out",
        str(out),
        "--embedder",
        "hashing",
        "--no-progress",
        "--checkpoint-every",
        "1",
        *extra,
    ]


def test_two_concurrent_ingest_processes_on_one_store_both_finish_and_lose_nothing(tmp_path: Path) -> None:
    out = tmp_path / "shared.pgr"
    first = _jsonl(tmp_path / "a.jsonl", {"ua": 4, "both": 4})
    second = _jsonl(tmp_path / "b.jsonl", {"ub": 4, "both": 4})
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "pgr_core.cli.main", *_ingest_cmd(data, out, "--lock-timeout", "120")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for data in (first, second)
    ]
    results = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], results
    store = InMemoryStore.load(out, embedder=HashingEmbedder())
    ledger = Ledger(ledger_path_for(out))
    done = sorted((e.scope, e.session) for e in ledger.entries())
    assert done == sorted((u, f"s{i}") for u in ("ua", "ub", "both") for i in range(4))  # 'both' once each
    assert len(store) == 12
    _assert_ledger_matches_store(ledger, store)


def test_a_second_ingest_waits_then_names_the_holder_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "busy.pgr"
    data = _jsonl(tmp_path / "a.jsonl", {"ua": 1})
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pgr_core.stores._filelock import StoreLock;"
            " StoreLock(sys.argv[1], what='holder').acquire();"
            " print('held', flush=True); sys.stdin.read()",
            str(out),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code = main(_ingest_cmd(data, out, "--lock-timeout", "0"))
        err = capsys.readouterr().err.strip()
    finally:
        holder.communicate("")
    assert code == 2
    assert len(err.splitlines()) == 1 and f"process {holder.pid}" in err and "pgr: error:" in err
    assert not out.exists() and not ledger_path_for(out).exists()  # the refused run touched nothing


def test_a_failed_checkpoint_records_no_session(tmp_path: Path) -> None:
    path, ledger_path = tmp_path / "m.pgr", tmp_path / "m.pgr.ledger.jsonl"
    store, saves = _store(), {"n": 0}

    def checkpoint() -> None:
        saves["n"] += 1
        if saves["n"] >= 2:
            raise OSError(28, "No space left on device")
        store.save(path)

    with pytest.raises(OSError, match="No space"):
        Ingestor(store, ledger=Ledger(ledger_path), checkpoint=checkpoint, checkpoint_every=2).ingest(
            _sessions(6), scope=U
        )
    on_disk = InMemoryStore.load(path, embedder=HashingEmbedder())
    ledger = Ledger(ledger_path)
    assert sorted(e.session for e in ledger.entries()) == ["s0", "s1"]  # only what the one good save holds
    _assert_ledger_matches_store(ledger, on_disk)


def test_an_interrupt_mid_session_records_only_sessions_in_the_saved_store(tmp_path: Path) -> None:
    path, ledger_path = tmp_path / "m.pgr", tmp_path / "m.pgr.ledger.jsonl"

    class Interrupted(InMemoryStore):
        writes = 0

        def add_facts(self, facts: Any, **kw: Any) -> list[str]:
            type(self).writes += 1
            if type(self).writes == 4:
                raise KeyboardInterrupt
            return super().add_facts(facts, **kw)

    store = Interrupted(embedder=HashingEmbedder())
    with pytest.raises(KeyboardInterrupt):
        Ingestor(store, ledger=Ledger(ledger_path), checkpoint=lambda: store.save(path), checkpoint_every=10).ingest(
            _sessions(6), scope=U
        )
    ledger = Ledger(ledger_path)
    assert sorted(e.session for e in ledger.entries()) == ["s0", "s1", "s2"]  # saved on the way out, then recorded
    _assert_ledger_matches_store(ledger, InMemoryStore.load(path, embedder=HashingEmbedder()))


# =========================================================================== 2. corrupt ledgers and journals

GOOD = {
    "kind": "session",
    "scope": "u1",
    "owner": ["u1", None, None],
    "session": "s0",
    "hash": "h",
    "status": "ok",
    "facts": ["u1:s0:0"],
}


def _write_lines(path: Path, *lines: bytes) -> Path:
    path.write_bytes(b"".join(lines))
    return path


def _line(record: Any) -> bytes:
    return (json.dumps(record) + "\n").encode("utf-8")


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (b"[1, 2, 3]\n", "a JSON array, not a ledger record"),
        (b'"just a string"\n', "a JSON string, not a ledger record"),
        (_line(GOOD | {"sesion": "typo"}), r"unknown key\(s\) \['sesion'\]"),
        (_line({k: v for k, v in GOOD.items() if k != "kind"}), "'kind' must be"),
        (_line(GOOD | {"status": "done"}), "'status' must be one of"),
        (_line(GOOD | {"facts": "u1:s0:0"}), "'facts' must be a list"),
        (_line(GOOD | {"owner": ["u1"]}), "'owner' must be"),
        (b'{"kind": "session", "scope": \n', "not JSON"),
        (b'{"kind": "session", "scope": "\xc3"}\n', "not UTF-8"),
    ],
    ids=[
        "array",
        "string",
        "unknown-key",
        "no-kind",
        "bad-status",
        "facts-not-list",
        "bad-owner",
        "torn-middle",
        "bad-utf8-middle",
    ],
)
def test_a_corrupt_ledger_line_is_a_configuration_error_naming_file_and_line(
    tmp_path: Path, bad: bytes, says: str
) -> None:
    path = _write_lines(tmp_path / "l.jsonl", _line(GOOD), bad, _line(GOOD | {"session": "s9"}))
    with pytest.raises(ConfigurationError, match=rf"{re.escape(str(path))} line 2: .*{says}.*delete"):
        Ledger(path)


@pytest.mark.parametrize(
    "tail",
    [
        b'{"kind": "session", "scope": "u1", "sess',  # cut before its newline
        (json.dumps(GOOD | {"session": "s\u00e9"}, ensure_ascii=False).encode("utf-8"))[:-4] + b"\xc3",  # mid-char
        b'{"kind": "session", "scope": "u1", "sess\n',  # the last line, unparseable
        b'{"kind": "session", "error": "caf\xc3\n',  # the last line, undecodable
    ],
    ids=["no-newline", "mid-utf8", "unparseable-last", "undecodable-last"],
)
def test_a_torn_ledger_tail_is_skipped_and_the_next_append_is_intact(tmp_path: Path, tail: bytes) -> None:
    path = _write_lines(tmp_path / "l.jsonl", _line(GOOD), tail)
    with pytest.warns(RuntimeWarning, match="line 2 was torn by a crash"):
        ledger = Ledger(path)
    assert [e.session for e in ledger.entries()] == ["s0"]
    ledger.record([LedgerEntry("u1", "s1", "h1", "ok", facts=["u1:s1:0"], owner=["u1", None, None])])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing torn any more
        reread = Ledger(path)
    assert [e.session for e in reread.entries()] == ["s0", "s1"]
    assert path.read_bytes().count(b"\n") == 2


def test_the_ingestor_resumes_past_a_torn_ledger_tail(tmp_path: Path) -> None:
    ledger_path = tmp_path / "l.jsonl"
    store = _store()
    Ingestor(store, ledger=Ledger(ledger_path)).ingest(_sessions(2), scope=U)
    with ledger_path.open("ab") as fh:
        fh.write(b'{"kind": "session", "scope": "u1", "session": "s2", "ha')  # a crash mid-line
    with pytest.warns(RuntimeWarning):
        report = Ingestor(store, ledger=Ledger(ledger_path)).ingest(_sessions(4), scope=U)
    assert report.skipped == 2 and report.ingested == 2
    assert sorted(e.session for e in Ledger(ledger_path).entries()) == ["s0", "s1", "s2", "s3"]


_INTENT = {
    "op": "intent",
    "swap": "x",
    "merged": Fact(id="m", text="t", scope=U).to_dict(),
    "originals": [Fact(id="a", text="t", scope=U).to_dict()],
}


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (b"[1]\n", "a JSON array, not a journal record"),
        (b"42\n", "a JSON int, not a journal record"),
        (_line({"op": "commit", "swap": "x", "extra": 1}), r"unknown key\(s\) \['extra'\]"),
        (_line({"op": "rollback", "swap": "x"}), "'op' must be"),
        (_line(_INTENT | {"merged": {"text": "no id"}}), "'merged' holds a fact that cannot be read"),
        (_line(_INTENT | {"originals": [{"id": "a", "text": "t", "scope": "u1"}]}), "'originals' holds a fact"),
        (b'{"op": "commit", "swap": "\xff"}\n', "not UTF-8"),
    ],
    ids=["array", "number", "unknown-key", "bad-op", "merged-unreadable", "original-unreadable", "bad-utf8-middle"],
)
def test_a_corrupt_journal_line_is_a_configuration_error_naming_file_and_line(
    tmp_path: Path, bad: bytes, says: str
) -> None:
    path = _write_lines(
        tmp_path / "j.jsonl", _line({"op": "commit", "swap": "y"}), bad, _line({"op": "commit", "swap": "z"})
    )
    with pytest.raises(ConfigurationError, match=rf"{re.escape(str(path))} line 2: .*{says}"):
        Journal(path)


def test_a_torn_journal_tail_mid_utf8_is_skipped_and_the_next_record_is_intact(tmp_path: Path) -> None:
    path = _write_lines(
        tmp_path / "j.jsonl", _line(_INTENT), _line({"op": "commit", "swap": "x"}), '{"op": "é'.encode()[:-1]
    )
    with pytest.warns(RuntimeWarning, match="line 3 was torn"):
        journal = Journal(path)
    journal.commit("y")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[-1]) == {"op": "commit", "swap": "y"} and len(lines) == 3


def test_the_sqlite_ledger_keeps_records_across_opens_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "memory" / "ledger.sqlite3"
    with open_ledger(path) as ledger:
        assert isinstance(ledger, SqliteLedger) and ledger.journal_mode == "wal"
        store = _store()
        assert Ingestor(store, ledger=ledger).ingest(_sessions(3), scope=U).ingested == 3
        ledger.record_consolidation(U, 0)
    with open_ledger(path) as again:
        assert Ingestor(store, ledger=again).ingest(_sessions(4), scope=U).skipped == 3
        assert len(again) == 4 and again.pending(U) == 0
    assert ledger_path_for(tmp_path / "memory") == path  # a directory store keeps it inside
    assert ledger_path_for(tmp_path / "m.pgr") == tmp_path / "m.pgr.ledger.jsonl"
    assert type(open_ledger(tmp_path / "m.pgr.ledger.jsonl")) is Ledger


def test_a_corrupt_sqlite_ledger_is_a_configuration_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    SqliteLedger(path).close()
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO records (record) VALUES (?)", ("[1, 2]",))
    with pytest.raises(ConfigurationError, match=rf"{re.escape(str(path))} record 1: a JSON array"):
        SqliteLedger(path)
    garbage = tmp_path / "other.sqlite3"
    garbage.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(ConfigurationError, match="not a usable SQLite ledger"):
        open_ledger(garbage)


def test_a_ledger_written_before_owners_were_kept_apart_is_still_read(tmp_path: Path) -> None:
    session = _sessions(1)[0]
    old = {k: v for k, v in GOOD.items() if k != "owner"} | {"session": "s0", "hash": session.content_hash}
    path = _write_lines(
        tmp_path / "old.jsonl", _line(old), _line({"kind": "consolidation", "scope": "u1", "merged": 1})
    )
    ledger = Ledger(path)
    assert ledger.is_done(U, session) and not ledger.is_done(Scope(user_id="u2"), session)


# =========================================================================== 4. a rerun rewords the extraction


def _llm(replies: Mapping[str, list[str]]) -> ScriptedLLM:
    def handler(messages: Sequence[Mapping[str, str]], schema: Any) -> Any:
        session = re.search(r"session (\S+), held on", messages[0]["content"])
        assert session
        return {"facts": [{"text": t, "type": "Identity"} for t in replies[session.group(1)]]}

    return ScriptedLLM(handler=handler)


DOG = [Session("s1", "2025-03-02", [Turn("user", "I drink green tea and my dog Rex is three")])]


def test_a_rerun_after_a_crash_before_the_ledger_replaces_the_sessions_facts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, ledger_path = tmp_path / "m.pgr", tmp_path / "m.pgr.ledger.jsonl"
    store = _store()
    first = _llm({"s1": ["The user likes green tea.", "Has a dog named Rex."]})

    def die(self: Ledger, entries: Any) -> None:
        raise SystemExit("killed after the checkpoint, before the ledger line")

    monkeypatch.setattr(Ledger, "record", die)
    with pytest.raises(SystemExit):
        Ingestor(store, llm=first, ledger=Ledger(ledger_path), checkpoint=lambda: store.save(path)).ingest(DOG, scope=U)
    monkeypatch.undo()
    resumed = InMemoryStore.load(path, embedder=HashingEmbedder())
    assert len(resumed) == 2 and len(Ledger(ledger_path)) == 0
    reworded = _llm({"s1": ["Owns a dog called Rex."]})
    report = Ingestor(resumed, llm=reworded, ledger=Ledger(ledger_path), checkpoint=lambda: resumed.save(path)).ingest(
        DOG, scope=U
    )
    assert report.ingested == 1
    final = InMemoryStore.load(path, embedder=HashingEmbedder())
    assert [f.text for f in final.facts] == ["Owns a dog called Rex."]  # one fact per statement
    assert "Has a dog named Rex" not in reworded.calls[0].prompt  # its own old facts are not shown as memories
    _assert_ledger_matches_store(Ledger(ledger_path), final)


def test_a_fact_a_later_session_confirmed_survives_the_first_sessions_rerun() -> None:
    store = _store()
    s2 = Session("s2", "2025-03-05", [Turn("user", "Rex my dog turned four")])

    def handler(messages: Sequence[Mapping[str, str]], schema: Any) -> Any:
        prompt = messages[0]["content"]
        if "session s2," in prompt:
            handle = re.search(r"(E\d+) \[[^\]]*\] [^\n]*Rex", prompt)
            assert handle
            return {
                "facts": [{"text": "Has a dog named Rex, now four.", "type": "Identity", "updates": handle.group(1)}]
            }
        return {"facts": [{"text": "Has a dog named Rex.", "type": "Identity"}]}

    Ingestor(store, llm=ScriptedLLM(handler=handler), ledger=Ledger()).ingest([*DOG, s2], scope=U)
    assert [f.metadata["sessions"] for f in store.facts] == [["s1", "s2"]]
    Ingestor(store, llm=_llm({"s1": ["The user likes green tea."]}), ledger=Ledger()).ingest(DOG, scope=U)
    assert sorted(f.text for f in store.facts) == ["Has a dog named Rex, now four.", "The user likes green tea."]


# =========================================================================== 5. consolidation: fixed point, span


DAY0 = datetime(2025, 3, 1)
TENNIS = [
    "The user plays tennis on Sundays.",
    "The user plays tennis every Sunday.",
    "The user plays tennis on Sunday mornings.",
]


def _tennis_store(owner: Scope = U, *, days: int = 28, every: int = 2) -> InMemoryStore:
    store = _store()
    store.add_facts(
        [
            Fact(
                id=f"{scope_label(owner)}:t{d}",
                text=TENNIS[(d // every) % 3],
                scope=owner,
                type="Activity",
                date=DAY0 + timedelta(days=d),
                metadata={"frequency": 1, "sessions": [f"s{d}"], "source": "extracted"},
            )
            for d in range(0, days, every)
        ]
    )
    return store


def _reworder() -> ScriptedLLM:
    return ScriptedLLM(
        handler=lambda messages, schema: {"text": "The user is a keen Sunday tennis player.", "type": "Activity"}
    )


def _state(store: InMemoryStore) -> list[tuple[str, str]]:
    return sorted((f.id, f.text) for f in store.facts)


@pytest.mark.parametrize("llm", [None, _reworder], ids=["no-llm", "llm-rewords"])
def test_consolidating_twice_is_a_fixed_point_and_no_merge_spans_more_than_the_window(
    llm: Callable[[], ScriptedLLM] | None,
) -> None:
    store = _tennis_store()
    originals = {f.id: f.date for f in store.facts}
    make = (lambda: None) if llm is None else llm
    first = Consolidator(store, make(), threshold=0.7).consolidate(U)
    assert first.merged >= 2
    after_one = _state(store)
    second = Consolidator(store, make(), threshold=0.7).consolidate(U)
    third = Consolidator(store, make(), threshold=0.7).consolidate(U)
    assert second.merged == third.merged == 0 and _state(store) == after_one
    covered: list[str] = []
    for fact in store.facts:
        ids = fact.metadata.get("merged_from") or [fact.id]
        covered += ids
        dates = [originals[i] for i in ids]
        assert max(dates) - min(dates) <= timedelta(days=7), f"{fact.id} spans {min(dates)}..{max(dates)}"
        if "span" in fact.metadata:
            assert fact.metadata["span"] == [min(dates).isoformat(), max(dates).isoformat()]
    assert sorted(covered) == sorted(originals)  # every original stands in exactly one fact


def test_a_merged_fact_takes_a_new_fact_only_while_its_whole_span_stays_in_the_window() -> None:
    store = _tennis_store(days=5, every=2)  # days 0, 2, 4
    Consolidator(store, None, threshold=0.7).consolidate(U)
    (merged,) = store.facts
    late = Fact(id="u1:late", text=TENNIS[0], scope=U, type="Activity", date=DAY0 + timedelta(days=9))
    close = Fact(id="u1:close", text=TENNIS[1], scope=U, type="Activity", date=DAY0 + timedelta(days=6))
    store.add_facts([late, close])
    Consolidator(store, None, threshold=0.7).consolidate(U)
    by_id = {f.id: f for f in store.facts}
    assert "u1:late" in by_id  # day 9 would make the span 0..9
    (grown,) = [f for f in by_id.values() if f.id != "u1:late"]
    assert sorted(grown.metadata["merged_from"]) == sorted([merged.id, "u1:close"])
    assert grown.metadata["span"] == [DAY0.isoformat(), (DAY0 + timedelta(days=6)).isoformat()]


def test_consolidation_killed_mid_swap_then_rerun_ends_at_the_same_fixed_point(tmp_path: Path) -> None:
    path, journal = tmp_path / "m.pgr", tmp_path / "m.pgr.journal.jsonl"
    clean = _tennis_store()
    Consolidator(clean, None, threshold=0.7).consolidate(U)

    store = _tennis_store()
    store.save(path)
    originals = sorted(f.id for f in store.facts)
    swaps = {"n": 0}

    def fault(point: str) -> None:
        if point == "deleted":
            swaps["n"] += 1
            if swaps["n"] == 2:
                raise SystemExit("killed mid-swap")

    with pytest.raises(SystemExit):
        Consolidator(
            store, None, threshold=0.7, journal=Journal(journal), checkpoint=lambda: store.save(path), fault=fault
        ).consolidate(U)
    for _ in range(3):  # the kill, then two more runs: nothing lost, nothing merged twice
        store = InMemoryStore.load(path, embedder=HashingEmbedder())
        Consolidator(
            store, None, threshold=0.7, journal=Journal(journal), checkpoint=lambda s=store: s.save(path)
        ).consolidate(U)
    final = InMemoryStore.load(path, embedder=HashingEmbedder())
    assert sorted(i for f in final.facts for i in f.metadata.get("merged_from") or [f.id]) == originals
    assert _state(final) == _state(clean)


# =========================================================================== 6. ambiguous keys


def test_scopes_and_sessions_that_join_to_the_same_string_get_distinct_keys(tmp_path: Path) -> None:
    assert scope_label(Scope(user_id="u1/x")) != scope_label(Scope(user_id="u1", agent_id="x"))
    assert scope_label(Scope(agent_id="bot")) != scope_label(Scope(user_id="bot"))
    assert scope_label(Scope(user_id="a=bot")) != scope_label(Scope(agent_id="bot"))
    turn = [Turn("user", "hello there")]
    a = raw_facts(Session("b:c", "2025-01-01", turn), Scope(user_id="a"))
    b = raw_facts(Session("c", "2025-01-01", turn), Scope(user_id="a:b"))
    assert a[0].id != b[0].id and a[0].session_id != b[0].session_id

    ledger_path, store = tmp_path / "l.jsonl", _store()
    session = Session("s", "2025-01-01", turn)
    owners = [Scope(user_id="u1/x"), Scope(user_id="u1", agent_id="x")]
    for owner in owners:
        assert Ingestor(store, ledger=Ledger(ledger_path)).ingest([session], scope=owner).ingested == 1
    assert len({f.id for f in store.facts}) == 2
    reread = Ledger(ledger_path)
    assert all(reread.is_done(o, session) for o in owners) and len(reread) == 2

    llm = _llm({"b:c": ["Fact one."], "c": ["Fact two."]})
    extracted = _store()
    Ingestor(extracted, llm=llm).ingest([Session("b:c", "2025-01-01", turn)], scope=Scope(user_id="a"))
    Ingestor(extracted, llm=llm).ingest([Session("c", "2025-01-01", turn)], scope=Scope(user_id="a:b"))
    assert sorted(f.text for f in extracted.facts) == ["Fact one.", "Fact two."]


# =========================================================================== 7. merges stay within one owner


def test_consolidating_an_agents_scope_never_merges_two_users_facts() -> None:
    alice, bob = Scope(user_id="alice", agent_id="bot"), Scope(user_id="bob", agent_id="bot")
    store = _store()
    facts = [
        Fact(
            id=f"{who}:{k}",
            text=TENNIS[k],
            scope=owner,
            type="Activity",
            date=DAY0 + timedelta(days=k),
            metadata={"sessions": [f"s{k}"]},
        )
        for who, owner in (("alice", alice), ("bob", bob))
        for k in range(2)
    ]
    store.add_facts(facts)
    report = Consolidator(store, None, threshold=0.7).consolidate(Scope(agent_id="bot"))
    assert report.merged == 2
    for owner, who in ((alice, "alice"), (bob, "bob")):
        (merged,) = [f for f in store.facts if f.scope == owner]
        assert sorted(merged.metadata["merged_from"]) == [f"{who}:0", f"{who}:1"]
    assert Consolidator(store, None, threshold=0.7).consolidate(Scope(agent_id="bot")).merged == 0


# =========================================================================== 8. the SQLite journal (directory stores)


def _journal_fact(fid: str, text: str = "t") -> Fact:
    return Fact(id=fid, text=text, scope=U, type="Activity", date=DAY0, metadata={"sessions": ["s1"]})


def test_the_sqlite_journal_round_trips_intent_commit_and_pending_in_order(tmp_path: Path) -> None:
    from pgr_core.write import SqliteJournal, open_journal
    from pgr_core.write.consolidate import journal_path_for

    path = tmp_path / "memory" / "journal.sqlite3"
    swaps = {
        s: (_journal_fact(f"m{s}", f"merged {s}"), [_journal_fact(f"{s}1"), _journal_fact(f"{s}2")]) for s in "abc"
    }
    with open_journal(path) as journal:
        assert isinstance(journal, SqliteJournal) and journal.journal_mode == "wal"
        for swap, (merged, originals) in swaps.items():
            journal.intent(swap, merged, originals)
        journal.commit("b")
        journal.clear()  # something is pending: nothing is forgotten
    with sqlite3.connect(path) as db:  # each intent and commit is a committed row, there at once
        assert db.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 4
    with SqliteJournal(path) as again:
        pending = again.pending()
        assert [swap for swap, _, _ in pending] == ["a", "c"]  # oldest first, b committed
        for swap, merged, originals in pending:
            assert merged.to_dict() == swaps[swap][0].to_dict()
            assert [f.to_dict() for f in originals] == [f.to_dict() for f in swaps[swap][1]]
        again.commit("c")
        again.commit("a")
        assert again.pending() == []
        again.clear()
    with SqliteJournal(path) as cleared:
        assert cleared.pending() == []
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 0
    assert journal_path_for(tmp_path / "memory") == path
    assert journal_path_for(tmp_path / "m.pgr") == tmp_path / "m.pgr.journal.jsonl"
    assert type(open_journal(tmp_path / "m.pgr.journal.jsonl")) is Journal
    assert open_journal(None).path is None


@pytest.mark.parametrize("point", ["intent", "added", "deleted", "checkpointed"])
def test_a_kill_between_intent_and_commit_is_rolled_forward_from_the_sqlite_journal(tmp_path: Path, point: str) -> None:
    from pgr_core.write import SqliteJournal

    path, journal = tmp_path / "m.pgr", tmp_path / "journal.sqlite3"
    clean = _tennis_store()
    Consolidator(clean, None, threshold=0.7).consolidate(U)

    store = _tennis_store()
    store.save(path)
    originals = sorted(f.id for f in store.facts_for(U))
    swaps = {"n": 0}

    def fault(at: str) -> None:
        if at == point:
            swaps["n"] += 1
            if swaps["n"] == 2:
                raise SystemExit(f"killed at {at}")

    with pytest.raises(SystemExit):
        Consolidator(
            store, None, threshold=0.7, journal=SqliteJournal(journal), checkpoint=lambda: store.save(path), fault=fault
        ).consolidate(U)
    assert len(SqliteJournal(journal).pending()) == 1  # the intent was durable before the swap began
    store = InMemoryStore.load(path, embedder=HashingEmbedder())
    reopened = Consolidator(
        store, None, threshold=0.7, journal=SqliteJournal(journal), checkpoint=lambda: store.save(path)
    )
    assert reopened.recovered == 1 and SqliteJournal(journal).pending() == []
    for _ in range(2):  # then two more runs: nothing lost, nothing merged twice
        store = InMemoryStore.load(path, embedder=HashingEmbedder())
        Consolidator(
            store, None, threshold=0.7, journal=SqliteJournal(journal), checkpoint=lambda s=store: s.save(path)
        ).consolidate(U)
    final = InMemoryStore.load(path, embedder=HashingEmbedder())
    assert sorted(i for f in final.facts for i in f.metadata.get("merged_from") or [f.id]) == originals
    assert _state(final) == _state(clean)


def test_a_kill_9_mid_swap_on_a_directory_store_is_rolled_forward_by_the_next_consolidator(tmp_path: Path) -> None:
    from pgr_core.stores.builtin import open_store, save_copy
    from pgr_core.write import SqliteJournal

    out = tmp_path / "memory"
    save_copy(_tennis_store(days=6), out)  # three facts, one cluster
    with open_store(out, HashingEmbedder()) as store:
        originals = sorted(f.id for f in store.facts_for(U))
    script = (
        "import os, signal, sys\n"
        "from pgr_core import HashingEmbedder, Scope\n"
        "from pgr_core.stores.builtin import open_store\n"
        "from pgr_core.write import Consolidator, open_journal\n"
        "store = open_store(sys.argv[1], HashingEmbedder())\n"
        "def fault(at):\n"
        "    if at == 'added':\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "journal = open_journal(os.path.join(sys.argv[1], 'journal.sqlite3'))\n"
        "Consolidator(store, None, threshold=0.7, journal=journal, fault=fault).consolidate(Scope(user_id='u1'))\n"
    )
    run = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True, timeout=240)
    assert run.returncode == -9, run.stderr
    journal = out / "journal.sqlite3"
    with SqliteJournal(journal) as left:
        ((_, merged, _),) = left.pending()
    with open_store(out, HashingEmbedder()) as store:
        ids = {f.id for f in store.facts_for(U)}
        assert merged.id in ids and len(ids) == 4  # the merged fact was added, no original deleted yet
        with SqliteJournal(journal) as j:
            assert Consolidator(store, None, threshold=0.7, journal=j).recovered == 1
            assert j.pending() == []
        facts = store.facts_for(U)
    assert [f.id for f in facts] == [merged.id]
    assert sorted(facts[0].metadata["merged_from"]) == originals == sorted(ids - {merged.id})


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("[1, 2]", "a JSON array, not a journal record"),
        (42, "a JSON int, not a journal record"),
        ('{"op": "intent", "swap": "x", "merged"', "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (json.dumps({"op": "rollback", "swap": "x"}), "'op' must be"),
        (json.dumps({"op": "commit", "swap": "x", "extra": 1}), r"unknown key\(s\) \['extra'\]"),
        (json.dumps(_INTENT | {"merged": {"text": "no id"}}), "'merged' holds a fact that cannot be read"),
    ],
    ids=["array", "number", "cut-json", "blob", "bad-op", "unknown-key", "merged-unreadable"],
)
def test_a_corrupt_sqlite_journal_row_is_a_configuration_error_naming_file_row_and_what_to_do(
    tmp_path: Path, bad: Any, says: str
) -> None:
    from pgr_core.write import SqliteJournal

    path = tmp_path / "journal.sqlite3"
    with SqliteJournal(path) as journal:
        journal.commit("y")
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO records (record) VALUES (?)", (bad,))
        db.execute("INSERT INTO records (record) VALUES (?)", (json.dumps({"op": "commit", "swap": "z"}),))
    with pytest.raises(ConfigurationError, match=rf"{re.escape(str(path))} row 2: .*{says}.*move the journal away"):
        SqliteJournal(path)


def test_an_unusable_sqlite_journal_is_a_configuration_error(tmp_path: Path) -> None:
    from pgr_core.write import SqliteJournal, open_journal

    garbage = tmp_path / "journal.sqlite3"
    garbage.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(ConfigurationError, match=rf"{re.escape(str(garbage))} is not a usable SQLite journal"):
        open_journal(garbage)
    newer = tmp_path / "newer.sqlite3"
    SqliteJournal(newer).close()
    with sqlite3.connect(newer) as db:
        db.execute("PRAGMA user_version=7")
    with pytest.raises(ConfigurationError, match="journal format 7"):
        SqliteJournal(newer)


def test_pgr_ingest_and_consolidate_on_a_directory_store_keep_the_journal_in_sqlite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pgr_core.stores.builtin import open_store, save_copy
    from pgr_core.write import SqliteJournal

    monkeypatch.delenv("PGR_LLM_BASE_URL", raising=False)
    data = _jsonl(tmp_path / "a.jsonl", {"u0": 2})
    out = tmp_path / "memory"
    assert main(_ingest_cmd(data, out)) == 0
    assert (out / "journal.sqlite3").is_file() and not (out / "journal.jsonl").exists()
    file_store = tmp_path / "m.pgr"
    assert main(_ingest_cmd(data, file_store)) == 0  # a store file keeps its JSONL journal beside it
    assert not (tmp_path / "m.pgr.journal.sqlite3").exists() and not (file_store / "journal.sqlite3").exists()

    tennis = tmp_path / "tennis"
    save_copy(_tennis_store(), tennis)
    capsys.readouterr()
    args = ["consolidate", "--store", str(tennis), "--embedder", "hashing", "--no-llm", "--threshold", "0.7"]
    assert main([*args, "--json"]) == 0
    (report,) = json.loads(capsys.readouterr()[0])["users"]
    assert report["merged"] > 0
    assert (tennis / "journal.sqlite3").is_file() and not (tennis / "journal.jsonl").exists()
    with SqliteJournal(tennis / "journal.sqlite3") as journal:
        assert journal.pending() == []
    with open_store(tennis, HashingEmbedder()) as store:
        assert len(store) == report["facts_after"]


def test_a_swap_an_older_pgr_left_in_a_directory_stores_journal_jsonl_is_rolled_forward(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pgr_core.stores.builtin import open_store, save_copy

    monkeypatch.delenv("PGR_LLM_BASE_URL", raising=False)
    out = tmp_path / "memory"
    save_copy(_tennis_store(days=6), out)  # three facts, one cluster

    def fault(at: str) -> None:
        if at == "added":
            raise SystemExit("killed")

    with open_store(out, HashingEmbedder()) as store:
        originals = sorted(f.id for f in store.facts_for(U))
        with pytest.raises(SystemExit):  # as pgr did before: the journal in <DIR>/journal.jsonl
            Consolidator(store, None, threshold=0.7, journal=Journal(out / "journal.jsonl"), fault=fault).consolidate(U)
        assert len(store) == 4  # the merged fact is in, the originals still there
    capsys.readouterr()
    assert main(["consolidate", "--store", str(out), "--embedder", "hashing", "--no-llm", "--threshold", "0.7"]) == 0
    assert "recovered 1 interrupted swap" in capsys.readouterr().err
    assert not (out / "journal.jsonl").exists() and (out / "journal.sqlite3").is_file()
    with open_store(out, HashingEmbedder()) as store:
        (merged,) = store.facts_for(U)
    assert sorted(merged.metadata["merged_from"]) == originals
