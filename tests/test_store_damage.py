"""A damaged EdgeStore is refused, named, and repaired keeping every intact fact (issue 35, item 4).

Each case damages the engine's files the way a disk, a crash or a careless hand would (a flipped bit
or a truncation in the write-ahead log, a truncated id map, emptied segments, the record of
acknowledged facts deleted) and checks: opening raises DamagedStoreError naming the store and the
repair; ``EdgeStore.check`` and ``pgr store check`` report what is lost and change nothing;
``EdgeStore.repair`` and ``pgr store repair`` keep exactly the facts that are still there, list the
lost ones, and the repaired store opens and searches.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("qdrant_edge")

from pgr_core import Anticipating, DamagedStoreError, EdgeStore, Fact, HashingEmbedder, Scope, SearchParams
from pgr_core.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
ALICE = Scope(user_id="alice")
BOB = Scope(user_id="bob")
BATCHES, PER_BATCH = 3, 40


def _facts(batch: int, scope: Scope = ALICE) -> list[Fact]:
    return [Fact(id=f"b{batch}-{i}", text=f"batch {batch} fact {i} about knees", scope=scope) for i in range(PER_BATCH)]


def _write(path: Path, *, kill: bool) -> set[str]:
    """Three batches of acknowledged facts, closed cleanly or ended by kill -9 (nothing flushed)."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from pgr_core import EdgeStore, Fact, HashingEmbedder, Scope
        store = EdgeStore.open({str(path)!r}, embedder=HashingEmbedder())
        store.flush_every_s = 1e9  # segments flushed only at close: the log holds every write until then
        for b in range({BATCHES}):
            store.add_facts([Fact(id=f"b{{b}}-{{i}}", text=f"batch {{b}} fact {{i}} about knees",
                                  scope=Scope(user_id="alice")) for i in range({PER_BATCH})])
        if {kill}:
            os.kill(os.getpid(), signal.SIGKILL)
        store.close()
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == (-signal.SIGKILL if kill else 0), done.stderr
    return {f"b{b}-{i}" for b in range(BATCHES) for i in range(PER_BATCH)}


def _ids(path: Path) -> set[str]:
    with EdgeStore.open(path, embedder=HashingEmbedder()) as store:
        return {f.id for f in store.facts_for(ALICE)}


def _wal(path: Path) -> Path:
    return sorted((path / "shard" / "wal").glob("open-*"))[0]


def _flip_a_bit_in_the_log(path: Path) -> None:
    wal = _wal(path)
    data = bytearray(wal.read_bytes())
    data[4000] ^= 0x10
    wal.write_bytes(bytes(data))


def _truncate_the_log(path: Path) -> None:
    wal = _wal(path)
    wal.write_bytes(wal.read_bytes()[:9000])


def _truncate_the_id_map(path: Path) -> None:
    (mappings,) = (path / "shard" / "segments").glob("*/mutable_id_tracker.mappings")
    data = mappings.read_bytes()
    mappings.write_bytes(data[: len(data) // 3])


def _empty_the_segments(path: Path) -> None:
    for segment in (path / "shard" / "segments").iterdir():
        shutil.rmtree(segment)
        segment.mkdir()


DAMAGE: dict[str, tuple[bool, Callable[[Path], None]]] = {
    # name: (killed before any flush, how the files are damaged)
    "a flipped bit in the log": (True, _flip_a_bit_in_the_log),
    "a truncated log": (True, _truncate_the_log),
    "a truncated id map": (False, _truncate_the_id_map),
    "emptied segments": (False, _empty_the_segments),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_store_is_refused_checked_and_repaired_keeping_every_intact_fact(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "mem"
    killed, harm = DAMAGE[damage]
    written = _write(path, kill=killed)
    harm(path)
    with pytest.raises(DamagedStoreError) as refused:
        EdgeStore.open(path, embedder=HashingEmbedder())
    message = str(refused.value)
    assert str(path) in message and "pgr store repair" in message and "nothing was changed" in message
    assert refused.value.missing and all(m[0] == "alice" and m[3] in written for m in refused.value.missing)

    check = EdgeStore.check(path)
    assert not check["ok"] and check["acknowledged"] == len(written)
    lost = {m[3] for m in check["lost"]}
    assert lost == {m[3] for m in refused.value.missing} and check["held"] == len(written) - len(lost)
    assert EdgeStore.check(path)["lost"] == check["lost"]  # checking changed nothing

    report = EdgeStore.repair(path)
    assert report["repaired"] and {m[3] for m in report["lost"]} == lost and report["kept"] == check["held"]
    assert Path(report["damaged_copy"]).is_dir() and Path(report["report"]).is_file()
    kept = _ids(path)
    assert kept == written - lost  # every intact fact, and only those
    assert EdgeStore.check(path)["ok"]
    assert EdgeStore.repair(path)["repaired"] is False  # a whole store is left as it is
    with EdgeStore.open(path, embedder=HashingEmbedder()) as store:
        store.add_facts(_facts(9))  # writable again, and searchable
        (hits,) = store.search_batch(["batch 9 fact 3 about knees"], scope=ALICE, params=SearchParams(top_k=1))
        assert hits[0].fact.id == "b9-3"


def test_kill_9_without_damage_opens_with_every_fact(tmp_path: Path) -> None:
    path = tmp_path / "mem"
    written = _write(path, kill=True)
    assert _ids(path) == written
    assert EdgeStore.check(path)["ok"]


def test_a_deleted_record_of_acknowledged_facts_is_named_and_repair_keeps_every_fact(tmp_path: Path) -> None:
    path = tmp_path / "mem"
    written = _write(path, kill=False)
    (path / "acknowledged.sqlite3").unlink()
    with pytest.raises(DamagedStoreError, match=r"acknowledged\.sqlite3 is missing"):
        EdgeStore.open(path, embedder=HashingEmbedder())
    assert EdgeStore.check(path)["error"] is not None
    report = EdgeStore.repair(path)
    assert report["lost_unknown"] and report["kept"] == len(written)
    assert _ids(path) == written


def test_points_a_dead_writer_did_not_record_are_adopted_not_refused(tmp_path: Path) -> None:
    """The engine's log took the write, the process died before the record did: nothing is lost, the
    store opens with the fact and records it."""
    path = tmp_path / "mem"
    written = _write(path, kill=False)
    with sqlite3.connect(path / "acknowledged.sqlite3") as db:
        db.execute("DELETE FROM points WHERE fact_id = 'b1-7'")
        db.execute("UPDATE state SET value = '0' WHERE key = 'clean'")
    assert _ids(path) == written
    check = EdgeStore.check(path)
    assert check["ok"] and check["acknowledged"] == len(written)


def test_a_store_from_before_the_record_adopts_what_it_holds(tmp_path: Path) -> None:
    path = tmp_path / "mem"
    written = _write(path, kill=False)
    (path / "acknowledged.sqlite3").unlink()
    meta = (path / "meta.json").read_text()
    (path / "meta.json").write_text(meta.replace('"acknowledged": true', '"acknowledged": false'))
    assert _ids(path) == written
    assert EdgeStore.check(path)["ok"]


def test_deletes_are_acknowledged_too(tmp_path: Path) -> None:
    path = tmp_path / "mem"
    with EdgeStore.open(path, embedder=HashingEmbedder()) as store:
        store.add_facts(_facts(0))
        store.add_facts(_facts(0, BOB))
        assert store.delete(["b0-1", "b0-2"], scope=ALICE) == 2
    check = EdgeStore.check(path)
    assert check["ok"] and check["acknowledged"] == 2 * PER_BATCH - 2


def test_an_anticipating_over_a_damaged_cue_index_is_refused_and_the_store_released(tmp_path: Path) -> None:
    path = tmp_path / "mem"
    with Anticipating(EdgeStore.open(path, embedder=HashingEmbedder())) as store:
        store.add_facts(_facts(0))
        store.put_cues({f.id: [f"cue one for {f.id}", f"cue two for {f.id}"] for f in _facts(0)}, _facts(0))
    _empty_the_segments(path / "cues")
    _truncate_the_log(path / "cues")
    with pytest.raises(DamagedStoreError, match="cues"):
        Anticipating(EdgeStore.open(path, embedder=HashingEmbedder()))
    assert _ids(path) == {f.id for f in _facts(0)}  # the facts' store was closed: it opens again


def test_the_cli_checks_and_repairs_the_store_and_its_cue_index(tmp_path: Path, capsys) -> None:
    path = tmp_path / "mem"
    written = _write(path, kill=False)
    _truncate_the_id_map(path)
    assert main(["store", "check", str(path), "--json", str(tmp_path / "check.json")]) == 1
    out = capsys.readouterr()
    assert "DAMAGED" in out.out and "lost: b" in out.out and f"pgr store repair {path}" in out.err
    assert main(["store", "repair", str(path)]) == 0
    out = capsys.readouterr().out
    assert "repaired:" in out and "damaged shard is kept at" in out
    assert main(["store", "check", str(path)]) == 0
    assert "ok" in capsys.readouterr().out
    assert len(_ids(path)) < len(written)


def test_the_cli_says_what_check_is_for(tmp_path: Path, capsys) -> None:
    (tmp_path / "x.pgr").write_bytes(b"")
    assert main(["store", "check", str(tmp_path / "x.pgr")]) == 2
    assert "EdgeStore directories" in capsys.readouterr().err
    assert main(["store", "check", str(tmp_path)]) == 2
    assert "not an EdgeStore directory" in capsys.readouterr().err
