"""Bad command-line input ends in one line, ``pgr: error: ...``, and exit 2 (never a traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pgr_core.cli.main import main, parse_set_options
from pgr_core.errors import InvalidArgumentError


@pytest.fixture
def tiny_set(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.jsonl"
    rows = [
        {
            "user_id": "u",
            "facts": [
                {"id": "u:f1", "text": "I hurt my knee in March", "date": "2025-03-01"},
                {"id": "u:f2", "text": "I sold my car last year", "date": "2025-01-01"},
            ],
            "queries": [
                {"id": "u:q1", "query": "Should I run a 10k?", "references": [{"text": "knee", "fact_ids": ["u:f1"]}]}
            ],
        }
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err, "nothing on stderr"
    assert "Traceback" not in "\n".join(err)
    return err[-1]


@pytest.mark.parametrize(
    ("setting", "names"),
    [
        ("delta=three", "delta must be an integer"),
        ("delta", "write NAME=VALUE"),
        ("=3", "write NAME=VALUE"),
        ("nosuch=1", "'nosuch' is not a PGR option"),
        ("query_share=[1,", "must be JSON"),
    ],
)
def test_bad_set_options_are_one_line(
    setting: str, names: str, tiny_set: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "eval",
        "jsonl",
        "--data",
        str(tiny_set),
        "--no-llm",
        "--methods",
        "pgr-none",
        "--embedder",
        "hashing",
        "--no-cache",
        "--json",
        str(tmp_path / "out.json"),
        "--set",
        setting,
    ]
    assert main(argv) == 2
    line = _error_line(capsys)
    assert line.startswith("pgr: error:") and names in line
    assert not (tmp_path / "out.records.jsonl").exists()  # refused before anything ran


def test_set_options_parse_json_and_plain_words() -> None:
    assert parse_set_options(["delta=3", "ranking=llm", "query_share=0.5", "phase1_reuse=true"]) == {
        "delta": 3,
        "ranking": "llm",
        "query_share": 0.5,
        "phase1_reuse": True,
    }
    with pytest.raises(InvalidArgumentError, match="ranking must be one of"):
        parse_set_options(["ranking=best"])
    assert parse_set_options(["ranking=shared", "query_share=0.4"]) == {"ranking": "shared", "query_share": 0.4}
    with pytest.raises(InvalidArgumentError, match=r"query_share must be a number in \[0, 1\]"):
        parse_set_options(["query_share=-0.1"])
    with pytest.raises(InvalidArgumentError, match="ranking must be one of"):
        parse_set_options(["ranking=scored"])  # measured and deleted
    for deleted in ("augment=false", "intent_probe=false"):  # options whose other setting lost
        with pytest.raises(InvalidArgumentError, match="is not a PGR option"):
            parse_set_options([deleted])
    with pytest.raises(InvalidArgumentError, match="neighbour_decay must be a number in"):
        parse_set_options(["neighbour_decay=null"])


def test_locomo_loader_on_a_jsonl_file_says_which_command(tiny_set: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "locomo", "--data", str(tiny_set), "--no-llm", "--methods", "query-only"]) == 2
    line = _error_line(capsys)
    assert "not a LoCoMo JSON file" in line and "pgr eval jsonl" in line


def test_locomo_loader_on_other_json_names_the_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "locomo10.json"
    other.write_text('{"hello": 1}', encoding="utf-8")
    assert main(["eval", "locomo", "--data", str(other), "--no-llm", "--methods", "query-only"]) == 2
    assert "list of conversations" in _error_line(capsys)


def test_an_unwritable_output_path_is_one_line(
    tiny_set: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x", encoding="utf-8")
    argv = [
        "eval",
        "jsonl",
        "--data",
        str(tiny_set),
        "--no-llm",
        "--methods",
        "query-only",
        "--embedder",
        "hashing",
        "--no-cache",
        "--json",
        str(blocker / "out.json"),
    ]
    assert main(argv) == 2
    line = _error_line(capsys)
    assert line.startswith("pgr: error: cannot use") and "a-file" in line


def test_an_unwritable_trace_page_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x", encoding="utf-8")
    assert main(["demo", "--embedder", "hashing", "--html", str(blocker / "t.html")]) == 2
    assert _error_line(capsys).startswith("pgr: error: cannot use")


@pytest.mark.parametrize(
    "argv",
    [
        ["consolidate", "--store", "x.pgr", "--window-days", "nan"],
        ["consolidate", "--store", "x.pgr", "--window-days", "-1"],
        ["consolidate", "--store", "x.pgr", "--threshold", "1.5"],
        ["retrieve", "q", "--store", "x.pgr", "--user", "u", "--query-only", "--top-k", "-3"],
        ["retrieve", "q", "--store", "x.pgr", "--user", "u", "--lock-timeout", "inf"],
        ["eval", "jsonl", "--data", "x.jsonl", "--every", "0"],
        ["ingest", "jsonl", "--data", "x.jsonl", "--out", "s", "--window", "two"],
    ],
)
def test_bad_numbers_on_the_command_line_are_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pgr: error:")
