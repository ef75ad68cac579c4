"""The command line as scripts and people meet it: a scope that owns nothing, options that only go with
others, ``--strict``, Ctrl-C during ingest, the LLM timeout a local server gets, and summaries cut where
a sentence ends (issue 13, "A CLI that behaves")."""

from __future__ import annotations

import contextlib
import io
import json
import re
import signal
from pathlib import Path

import pytest
from loopback_llm import LoopbackLLM, error

from pgr_core.cli import main as cli
from pgr_core.cli.main import DEGRADED_EXIT, NO_FACTS_EXIT, main
from pgr_core.errors import InvalidArgumentError
from pgr_core.flow.timeouts import LOCAL_TIMEOUT_S, REMOTE_TIMEOUT_S, default_llm_timeout, is_local_server
from pgr_core.policy.prospectors import tidy_summary


@pytest.fixture(autouse=True)
def no_llm(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGR_LLM_BASE_URL", "PGR_LLM_MODEL", "PGR_LLM_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("PGR_LLM_TIMEOUT", raising=False)


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("demo")
    store = where / "maya.pgr"
    argv = ["demo", "--embedder", "hashing", "--no-llm", "--save-store", str(store), "--html", str(where / "t.html")]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main([*argv, "--json"]) == 0
    return store


def _retrieve(store: Path, *more: str) -> list[str]:
    return ["retrieve", "Should I join a soccer league?", "--store", str(store), "--embedder", "hashing", *more]


# --------------------------------------------------------------------------- no silent empties


def test_a_missing_user_names_the_option_and_the_users_the_store_holds(
    demo_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_retrieve(demo_store, "--no-llm")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("pgr: error: --user is required") and "1 user(s): maya" in err[-1]


def test_a_user_with_no_facts_is_said_so_not_answered_with_an_empty_list(
    demo_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_retrieve(demo_store, "--no-llm", "--user", "mya", "--json")) == NO_FACTS_EXIT
    out, err = capsys.readouterr()
    assert out == ""  # no JSON that a script could read as "nothing bears on this"
    assert f"{demo_store} holds no facts for --user mya; it holds 1 user(s): maya" in err
    assert "Nothing in memory" not in out + err
    assert main(_retrieve(demo_store, "--no-llm", "--user", "maya", "--json")) == 0
    assert json.loads(capsys.readouterr().out)["facts"]


# --------------------------------------------------------------------------- options


def test_strategy_feedback_runs_one_llm_free_round(demo_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_retrieve(demo_store, "--no-llm", "--user", "maya", "--strategy", "feedback", "--json")) == 0
    out = json.loads(capsys.readouterr().out)
    trace = out["trace"]
    assert trace["prospector"] == "feedback" and trace["ranking"] == "summed"
    assert trace["usage"]["store_calls"] == 2 and trace["usage"]["llm_calls"] == 0
    step = trace["rounds"][1]["steps"][0]
    assert step["dimension"] == "feedback" and step["probe"].startswith("Should I join a soccer league?")
    assert out["facts"]


def test_top_k_without_query_only_is_refused_with_the_option_that_does_it(
    demo_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_retrieve(demo_store, "--no-llm", "--user", "maya", "--top-k", "5")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["pgr: error: --top-k sets K for --query-only; to cut PGR's ranked facts to N, use --max-facts N"]
    assert main(_retrieve(demo_store, "--no-llm", "--user", "maya", "--top-k", "5", "--query-only", "--json")) == 0
    assert len(json.loads(capsys.readouterr().out)["facts"]) == 5
    with pytest.raises(SystemExit) as stop:
        main(_retrieve(demo_store, "--no-llm", "--user", "maya", "--top-k", "-3", "--query-only"))
    assert stop.value.code == 2


def test_strict_exits_non_zero_only_when_the_result_is_degraded(
    demo_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with LoopbackLLM() as server:
        server.default = error(400, "the model is not loaded")  # not retried: every call fails at once
        llm = ["--base-url", server.base_url, "--model", "m", "--strategy", "cot", "--user", "maya", "--json"]
        assert main(_retrieve(demo_store, *llm)) == 0
        assert json.loads(capsys.readouterr().out)["trace"]["degraded"] is True
        assert main(_retrieve(demo_store, *llm, "--strict")) == DEGRADED_EXIT
        out, err = capsys.readouterr()
        assert json.loads(out)["trace"]["degraded"] is True and "1 of 1 result(s) degraded (--strict)" in err
    assert main(_retrieve(demo_store, "--no-llm", "--user", "maya", "--strict")) == 0  # nothing failed


# --------------------------------------------------------------------------- Ctrl-C


def _sessions(path: Path, n: int) -> Path:
    line = {
        "user_id": "u",
        "sessions": [
            {"id": f"s{i}", "date": f"2025-03-{i + 1:02d}", "turns": [{"speaker": "user", "text": f"fact number {i}"}]}
            for i in range(n)
        ],
    }
    path.write_text(json.dumps(line) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("store_name", ["u.pgr", "udir"])
def test_ctrl_c_during_ingest_is_one_line_saying_what_was_kept(
    store_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pgr_core.write.ingest import Ingestor

    data, out = _sessions(tmp_path / "d.jsonl", 5), tmp_path / store_name
    argv = ["ingest", "jsonl", "--data", str(data), "--out", str(out), "--embedder", "hashing", "--no-progress"]
    real, calls = Ingestor._ingest_session, []

    def stopped_at_the_fourth(self: Ingestor, *a: object, **k: object) -> None:
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        real(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(Ingestor, "_ingest_session", stopped_at_the_fourth)
    assert main([*argv, "--checkpoint-every", "1"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    assert err[-1] == (
        f"pgr: interrupted: 3 of 5 session(s) are kept in {out}; "
        "rerun the same command to resume (kept sessions are skipped)"
    )
    monkeypatch.setattr(Ingestor, "_ingest_session", real)
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["skipped"], report["ingested"], report["facts_in_store"]) == (3, 2, 5)


def test_the_console_script_ignores_a_second_ctrl_c_while_it_winds_down(monkeypatch: pytest.MonkeyPatch) -> None:
    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(cli, "main", lambda argv=None: 130)
    try:
        with pytest.raises(SystemExit) as stop:
            cli.run()
        assert stop.value.code == 130 and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    monkeypatch.setattr(cli, "main", lambda argv=None: 0)
    with pytest.raises(SystemExit):
        cli.run()
    assert signal.getsignal(signal.SIGINT) is before  # only an interrupted run touches the handler


# --------------------------------------------------------------------------- the LLM timeout


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://127.0.0.1:8081/v1", True),
        ("http://localhost:11434/v1", True),
        ("http://[::1]:8000/v1", True),
        ("http://192.168.1.20:8000/v1", True),
        ("http://10.0.0.5/v1", True),
        ("http://gpu-box.local:8000/v1", True),
        ("https://api.openai.com/v1", False),
        ("https://8.8.8.8/v1", False),
        (None, False),  # no URL: OpenAI's own API
    ],
)
def test_the_default_timeout_follows_the_server(url: str | None, local: bool) -> None:
    assert is_local_server(url) is local
    assert default_llm_timeout(url) == (LOCAL_TIMEOUT_S if local else REMOTE_TIMEOUT_S)


def test_the_commands_give_a_local_server_minutes_and_a_variable_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from pgr_core.cli.common import llm_from_args

    def timeout_of(*argv: str) -> float:
        llm = llm_from_args(cli.build_parser().parse_args(["demo", *argv]))
        return llm.timeout  # type: ignore[union-attr]

    assert timeout_of("--base-url", "http://127.0.0.1:8081/v1") == 600.0
    assert timeout_of("--base-url", "https://api.example.com/v1", "--model", "m") == 60.0
    monkeypatch.setenv("PGR_LLM_BASE_URL", "http://127.0.0.1:8081/v1")
    assert timeout_of() == 600.0
    assert timeout_of("--llm-timeout", "7") == 7.0
    monkeypatch.setenv("PGR_LLM_TIMEOUT", "45")
    assert timeout_of() == 45.0
    monkeypatch.setenv("PGR_LLM_TIMEOUT", "soon")
    with pytest.raises(InvalidArgumentError, match="PGR_LLM_TIMEOUT must be a number of seconds"):
        timeout_of()


# --------------------------------------------------------------------------- summaries


@pytest.mark.parametrize(
    ("reply", "shown"),
    [
        (
            'Your knee surgery in March rules out contact play. The records that matter are: <record id="',
            "Your knee surgery in March rules out contact play.",
        ),
        (
            'The surgery <record id="r2" step="s1" noted="2 months before">"knee surgery"</record> matters.',
            'The surgery "knee surgery" matters.',
        ),
        ("Weeknights are busy. Weekend leagues fit", "Weeknights are busy."),
        ("A briefing with no full stop", "A briefing with no full stop"),
        ("Ends with a question?", "Ends with a question?"),
    ],
)
def test_a_summary_is_cut_at_a_sentence_and_never_echoes_record_markup(reply: str, shown: str) -> None:
    assert tidy_summary(reply, 2000) == shown


def test_a_long_summary_is_cut_at_the_last_sentence_within_the_limit() -> None:
    text = "First point is here. Second point is longer than the rest of it. Third."
    assert tidy_summary(text, 40) == "First point is here."
    assert tidy_summary("one two three four five six", 14) == "one two three…"


def test_the_retrieval_result_carries_the_tidied_summary() -> None:
    from pgr_core import PGR, Fact, InMemoryStore, Scope
    from pgr_core.models.embedders import HashingEmbedder
    from pgr_core.testing import ScriptedLLM

    store = InMemoryStore(HashingEmbedder())
    store.add_facts([Fact("f1", "I had knee surgery in March", scope=Scope(user_id="u"))])
    cut = 'Mind the knee surgery before you sign up. The records that matter are: <record id="r1" step='
    llm = ScriptedLLM(
        [
            {"intent": "join a soccer league"},
            {"nodes": [{"id": "n1", "parent": None, "action": "see the physio about my knee", "dimension": "health"}]},
            {"nodes": []},
            {"summary": cut},
        ]
    )
    pgr = PGR(store, llm=llm, strategy="tot", delta=1, min_score=0.0)
    result = pgr.retrieve("Should I join a soccer league?", scope=Scope(user_id="u"))
    assert not result.degraded and llm.calls[-1].schema and "summary" in json.dumps(llm.calls[-1].schema)
    assert result.summary == "Mind the knee surgery before you sign up."


def test_retrieve_with_an_llm_prints_progress_per_call_and_round(
    demo_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from loopback_llm import sane_reply

    with LoopbackLLM() as server:
        server.default = sane_reply
        llm = ["--base-url", server.base_url, "--model", "m", "--strategy", "cot", "--user", "maya", "--json"]
        assert main(_retrieve(demo_store, *llm)) == 0
        calls = server.count
    out, err = capsys.readouterr()
    assert json.loads(out)["facts"]
    waits = [line for line in err.splitlines() if "waiting for the LLM" in line]
    assert len(waits) == calls and "query augmentation: waiting for the LLM (call 1)" in waits[0]
    assert all(line.startswith("  [") and "s] " in line for line in waits)
    # the request and its restatement q_A (the loopback's steps are all refused as echoes)
    assert any(re.search(r"initial prospection: 2 probes, \d+ new facts", line) for line in err.splitlines())
    assert main(_retrieve(demo_store, "--no-llm", "--user", "maya", "--json")) == 0
    assert "waiting for the LLM" not in capsys.readouterr().err  # no LLM, nothing to wait for


def test_the_library_client_takes_the_same_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from pgr_core.models.llm import OpenAICompatible, llm_from_env

    assert OpenAICompatible(base_url="http://127.0.0.1:8081/v1", model="m").timeout == LOCAL_TIMEOUT_S
    assert OpenAICompatible(base_url="https://api.example.com/v1", model="m").timeout == REMOTE_TIMEOUT_S
    assert OpenAICompatible(base_url="http://127.0.0.1:8081/v1", model="m", timeout=5).timeout == 5
    monkeypatch.setenv("PGR_LLM_BASE_URL", "http://localhost:8000/v1")
    assert llm_from_env().timeout == LOCAL_TIMEOUT_S  # type: ignore[union-attr]
    monkeypatch.setenv("PGR_LLM_TIMEOUT", "90")
    assert llm_from_env().timeout == 90.0  # type: ignore[union-attr]
    assert OpenAICompatible(model="m").timeout == 90.0


def test_a_real_ctrl_c_with_an_llm_call_in_flight_is_one_line_and_exit_130(tmp_path: Path) -> None:
    """SIGINT to the console script while extraction waits on a slow server: one line, 130, at once."""
    import subprocess
    import sys
    import time

    from loopback_llm import ok

    data, out = _sessions(tmp_path / "d.jsonl", 6), tmp_path / "store"

    def slow(_request: object) -> object:
        time.sleep(1.0)
        fact = {"text": "The user adopted a cat", "type": "Identity", "entities": [], "date": None, "updates": None}
        return ok(json.dumps({"facts": [fact]}))

    with LoopbackLLM() as server:
        server.default = slow  # type: ignore[assignment]
        argv = ["ingest", "jsonl", "--data", str(data), "--out", str(out), "--mode", "extract", "--no-progress"]
        argv += ["--embedder", "hashing", "--base-url", server.base_url, "--model", "m"]
        code = f"import sys; sys.argv = ['pgr', *{argv!r}]; from pgr_core.cli.main import run; run()"
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler),
        )
        deadline = time.monotonic() + 60
        while server.count < 3 and time.monotonic() < deadline:  # two sessions answered, a third in flight
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    lines = err.strip().splitlines()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and len(lines) == 2, err  # the start line, and the one line of the stop
    assert lines[-1].startswith("pgr: interrupted: ") and "of 6 session(s) are kept in" in lines[-1]
