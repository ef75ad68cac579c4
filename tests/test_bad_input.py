"""Issue 35, item 5: hostile input to a store or the CLI ends in one clear error, nothing stored or lost."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pgr_core import EdgeStore, Fact, HashingEmbedder, InMemoryStore, Scope
from pgr_core.errors import ConfigurationError, InvalidArgumentError

ALICE = Scope(user_id="alice")


@pytest.fixture(params=["memory", "edge"])
def store(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    if request.param == "memory":
        s = InMemoryStore(embedder=HashingEmbedder())
        s.add("Twisted my knee in February", scope=ALICE, id="t1")
        yield s
        return
    s = EdgeStore.open(tmp_path / "edge", embedder=HashingEmbedder())
    s.add("Twisted my knee in February", scope=ALICE, id="t1")
    yield s
    s.close()


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"x": value}
    return value


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"session_id": "s1", "position": 2**70}, "position must be an integer in"),
        ({"metadata": _nested(2000)}, "metadata nests deeper than"),
        ({"metadata": [1, 2]}, "metadata must be a mapping"),
    ],
    ids=["position-2**70", "metadata-2000-deep", "metadata-a-list"],
)
def test_a_bad_fact_is_refused_by_name_and_nothing_is_stored(store, kwargs, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgumentError, match=message):
        store.add("Sold the car in January", scope=ALICE, id="bad", **kwargs)
    assert store.get("bad", scope=ALICE) is None and store.get("t1", scope=ALICE) is not None


def test_string_vectors_are_refused_before_anything_is_stored(store) -> None:  # type: ignore[no-untyped-def]
    fact = Fact(id="v1", text="Sold the car in January", scope=ALICE)
    with pytest.raises(InvalidArgumentError, match="vectors must be numbers"):
        store.add_facts([fact], vectors=[["a"] * store.embedder.dim])
    assert store.get("v1", scope=ALICE) is None
    store.add_facts([fact], vectors=np.ones((1, store.embedder.dim)))  # numbers are fine
    assert store.get("v1", scope=ALICE) is not None


def test_get_and_delete_refuse_what_is_not_an_id_and_delete_nothing(store) -> None:  # type: ignore[no-untyped-def]
    for bad in (None, "", 7):
        with pytest.raises(InvalidArgumentError, match="a fact id must be a non-empty string"):
            store.get(bad, scope=ALICE)
    with pytest.raises(InvalidArgumentError, match=r"pass \['t1'\]"):
        store.delete("t1", scope=ALICE)  # a lone string: its characters are not ids
    assert store.get("t1", scope=ALICE) is not None
    assert store.delete(["t1"], scope=ALICE) == 1 and store.get("t1", scope=ALICE) is None


def test_a_lock_path_that_is_a_directory_is_a_clear_configuration_error(tmp_path: Path) -> None:
    path = tmp_path / "edge"
    EdgeStore.open(path, embedder=HashingEmbedder()).close()
    lock = next(p for p in tmp_path.rglob("*.lock") if p.is_file())
    lock.unlink()
    lock.mkdir()
    with pytest.raises(ConfigurationError, match=r"cannot use .* as the lock file"):
        EdgeStore.open(path, embedder=HashingEmbedder())


@pytest.mark.parametrize("command", ["eval", "ingest"])
def test_a_data_line_nested_too_deep_is_one_line_of_error(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pgr_core.cli.main import main

    data = tmp_path / "d.jsonl"
    data.write_text('{"user_id": "u1", "facts": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    argv = (
        [
            "eval",
            "jsonl",
            "--data",
            str(data),
            "--methods",
            "query-only",
            "--embedder",
            "hashing",
            "--json",
            str(tmp_path / "r.json"),
        ]
        if command == "eval"
        else ["ingest", "jsonl", "--data", str(data), "--out", str(tmp_path / "store"), "--embedder", "hashing"]
    )
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "line 1: nested too deep" in err and "Traceback" not in err


def test_two_processes_load_add_save_one_file_and_the_second_save_refuses(tmp_path: Path) -> None:
    """Issue 35, item 2: the second writer's save would silently drop the first one's facts."""
    import subprocess
    import sys
    import textwrap

    path = tmp_path / "m.pgr"
    base = InMemoryStore(embedder=HashingEmbedder())
    base.add("Twisted my knee in February", scope=ALICE, id="t1")
    base.save(path)
    first = InMemoryStore.load(path, embedder=HashingEmbedder())
    second = InMemoryStore.load(path, embedder=HashingEmbedder())
    # another process loads, adds and saves in between
    script = textwrap.dedent(f"""
        from pgr_core import HashingEmbedder, InMemoryStore, Scope
        s = InMemoryStore.load({str(path)!r}, embedder=HashingEmbedder())
        s.add("Sold the car in January", scope=Scope(user_id="alice"), id="other")
        s.save({str(path)!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True)
    first.add("Evening class on Tuesdays", scope=ALICE, id="mine")
    with pytest.raises(ConfigurationError, match="changed since this store loaded or saved it"):
        first.save(path)
    kept = InMemoryStore.load(path, embedder=HashingEmbedder())
    assert kept.get("other", scope=ALICE) is not None  # the other process's fact is not lost
    # the documented way through: load again, add, save
    again = InMemoryStore.load(path, embedder=HashingEmbedder())
    again.add("Evening class on Tuesdays", scope=ALICE, id="mine")
    again.save(path)
    both = InMemoryStore.load(path, embedder=HashingEmbedder())
    assert {"t1", "other", "mine"} <= {f.id for f in both.facts}
    # a store saving over its own last save needs no reload; one that never read the file may write it
    again.add("Likes early runs", scope=ALICE, id="later")
    again.save(path)
    assert second.get("t1", scope=ALICE) is not None
    with pytest.raises(ConfigurationError, match="changed since"):
        second.save(path)
    fresh = InMemoryStore(embedder=HashingEmbedder())
    fresh.add("A new memory", scope=ALICE, id="n1")
    fresh.save(tmp_path / "other.pgr")


def test_an_anticipating_whose_cue_index_fails_to_open_closes_the_store_it_was_given(tmp_path: Path) -> None:
    """Issue 35, item 4 (its last part): the wrapped store's lock is released, so it can be opened again."""
    from pgr_core import Anticipating

    path = tmp_path / "edge"
    EdgeStore.open(path, embedder=HashingEmbedder()).close()
    (path / "cues" / ".lock").mkdir(parents=True)  # the cue index cannot take its lock
    store = EdgeStore.open(path, embedder=HashingEmbedder(), lock_timeout_s=0)
    with pytest.raises(ConfigurationError, match="lock file"):
        Anticipating(store)
    again = EdgeStore.open(path, embedder=HashingEmbedder(), lock_timeout_s=0)  # not locked by the first
    again.close()
