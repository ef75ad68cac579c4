"""InMemoryStore never loses data and never answers a fault with a raw exception.

- Writes: a lone surrogate, non-JSON metadata, a string position or date, a NaN vector, an id another
  owner holds are refused with InvalidArgumentError naming the field, and nothing stored changes.
- Files: every kind of damage to a ``.pgr`` file is a ConfigurationError naming the file and what is
  wrong (the damaged member, the bad line, the missing key, the wrong shape).
- Processes: two processes saving one path, a reader loading while a writer saves, a save killed with
  SIGKILL: no error, and the file always loads as one writer's complete store.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import signal
import zipfile
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import U1, U2, make_store

from pgr_core import ConfigurationError, Fact, HashingEmbedder, InMemoryStore, InvalidArgumentError, Scope

SPAWN = multiprocessing.get_context("spawn")


def contents(store: InMemoryStore) -> tuple[list[dict[str, Any]], bytes]:
    return [f.to_dict() for f in store.facts], store._vectors.tobytes()


# ---------------------------------------------------------------- refused at the write


BAD_FACTS: dict[str, tuple[Callable[[], Fact], str]] = {
    "lone surrogate in text": (lambda: Fact(id="bad", text="knee \ud800 pain", scope=U1), "not valid UTF-8"),
    "lone surrogate in id": (lambda: Fact(id="bad\udfff", text="knee", scope=U1), "id is not valid UTF-8"),
    "non-JSON metadata": (lambda: Fact(id="bad", text="knee", scope=U1, metadata={"at": object()}), "metadata"),
    "NaN in metadata": (lambda: Fact(id="bad", text="knee", scope=U1, metadata={"x": float("nan")}), "metadata"),
    "position as a string": (
        lambda: Fact(id="bad", text="knee", scope=U1, session_id="s1", position="3"),  # type: ignore[arg-type]
        "position must be an integer",
    ),
    "date as a string": (
        lambda: Fact(id="bad", text="knee", scope=U1, date="2025-03-01"),  # type: ignore[arg-type]
        "date must be a datetime",
    ),
    "blank text": (lambda: Fact(id="bad", text="   ", scope=U1), "text must be a non-empty string"),
}


@pytest.mark.parametrize("fault", sorted(BAD_FACTS))
def test_a_bad_fact_is_refused_and_nothing_changes(fault: str) -> None:
    store = make_store()
    before = contents(store)
    make, message = BAD_FACTS[fault]
    good = Fact(id="good", text="a fine fact", scope=U1)
    with pytest.raises(InvalidArgumentError, match=message):
        store.add_facts([good, make()])
    assert contents(store) == before and store.get("good", scope=U1) is None


@pytest.mark.parametrize(
    "vectors, message",
    [
        (np.full((2, 256), np.nan, np.float32), "vector 0 holds NaN"),
        (np.vstack([np.eye(256, dtype=np.float32)[0], np.full(256, np.inf, np.float32)]), "vector 1 holds NaN"),
        (np.zeros((2, 256), np.float32), "all zeros"),
        (np.ones((2, 3), np.float32), r"shape \(2, 256\)"),
        (np.ones((1, 256), np.float32), r"shape \(2, 256\)"),
    ],
    ids=["nan", "inf", "zero", "wrong dim", "wrong count"],
)
def test_bad_given_vectors_are_refused_and_nothing_changes(vectors: np.ndarray, message: str) -> None:
    store = make_store()
    before = contents(store)
    facts = [Fact(id="a", text="first", scope=U1), Fact(id="b", text="second", scope=U1)]
    with pytest.raises(InvalidArgumentError, match=message):
        store.add_facts(facts, vectors=vectors)
    assert contents(store) == before


def test_an_embedder_that_returns_nan_is_refused() -> None:
    class Broken(HashingEmbedder):
        def embed(self, texts: Any) -> np.ndarray:
            out = super().embed(texts)
            out[-1, 0] = np.nan
            return out

    store = InMemoryStore(embedder=Broken(), embedding_cache=0)
    with pytest.raises(InvalidArgumentError, match=r"NaN or infinite values for fact 'b'"):
        store.add_facts([Fact(id="a", text="knee", scope=U1), Fact(id="b", text="bus", scope=U1)])
    assert len(store) == 0


def test_the_same_id_from_another_owner_is_refused_and_the_first_fact_kept() -> None:
    store = make_store()
    first = store.get("s1:0", scope=U1)
    assert first is not None
    vector = store.vectors_for(["s1:0"], scope=U1)
    with pytest.raises(InvalidArgumentError, match="'s1:0' belongs to another owner"):
        store.add("U2's text under U1's id", scope=U2, id="s1:0")
    with pytest.raises(InvalidArgumentError, match="'s1:0' belongs to another owner"):
        store.add_facts([Fact(id="s1:0", text="again", scope=Scope(user_id="u1", agent_id="bot"))])
    assert store.get("s1:0", scope=U1) == first and np.array_equal(store.vectors_for(["s1:0"], scope=U1), vector)
    assert store.get("s1:0", scope=U2) is None
    store.add("I hurt my ankle", scope=U1, id="s1:0", session_id="s1", position=0)  # its owner replaces it
    assert store.get("s1:0", scope=U1).text == "I hurt my ankle"  # type: ignore[union-attr]


def test_one_batch_giving_an_id_two_owners_is_refused() -> None:
    store = make_store()
    before = contents(store)
    with pytest.raises(InvalidArgumentError, match="different owners"):
        store.add_facts([Fact(id="x", text="one", scope=U1), Fact(id="x", text="two", scope=U2)])
    assert contents(store) == before


def test_mixed_naive_and_aware_dates_are_refused_at_the_write() -> None:
    store = make_store()  # naive dates
    before = contents(store)
    with pytest.raises(InvalidArgumentError, match="timezone-aware date but this store holds naive"):
        store.add("aware", scope=U1, date="2025-03-01T10:00:00+02:00")
    assert contents(store) == before


# ---------------------------------------------------------------- damaged files


def saved(tmp_path: Path) -> Path:
    return make_store().save(tmp_path / "m.pgr")


def rewrite(path: Path, **members: bytes | str | None) -> Path:
    """The archive at ``path`` with some members replaced (None: dropped)."""
    with zipfile.ZipFile(path) as zf:
        old: dict[str, bytes | str | None] = {name: zf.read(name) for name in zf.namelist()}
    old.update(members)
    out = path.with_name("damaged.pgr")
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in old.items():
            if data is not None:
                zf.writestr(name, data)
    return out


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def facts_lines(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as zf:
        return zf.read("facts.jsonl").decode().split("\n")


def with_line(path: Path, number: int, line: str) -> Path:
    lines = facts_lines(path)
    lines[number - 1] = line
    return rewrite(path, **{"facts.jsonl": "\n".join(lines)})


def replaced_by(data: bytes | None) -> Callable[[Path], Path]:
    """The file's bytes replaced (None: a directory put in its place)."""

    def damage(path: Path) -> Path:
        if data is None:
            path.unlink()
            path.mkdir()
        else:
            path.write_bytes(data)
        return path

    return damage


def truncated(path: Path) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def flipped(path: Path, where: Callable[[bytes], int]) -> Path:
    data = bytearray(path.read_bytes())
    data[where(bytes(data))] ^= 0xFF
    out = path.with_name("flipped.pgr")
    out.write_bytes(bytes(data))
    return out


def in_member(name: str, offset: int = 40) -> Callable[[bytes], int]:
    """A byte ``offset`` into the stored data of member ``name``."""

    def where(data: bytes) -> int:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            info = zf.getinfo(name)
        header = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
        return header + min(offset, info.compress_size - 1)

    return where


FILE_FAULTS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "flipped byte in the vectors (bad CRC)": (
        lambda p: flipped(p, in_member("vectors.npy", 500)),
        "vectors.npy in .* is damaged.*CRC",
    ),
    "flipped byte in the deflated facts (zlib)": (
        lambda p: flipped(p, in_member("facts.jsonl", 10)),
        "facts.jsonl in .* is damaged",
    ),
    "flipped byte in meta.json": (lambda p: flipped(p, in_member("meta.json", 5)), "meta.json in .* is damaged"),
    "flipped end-of-archive record": (lambda p: flipped(p, lambda d: len(d) - 20), "not a pgr store file"),
    "truncated file": (truncated, "not a pgr store file"),
    "not a zip at all": (replaced_by(b"hello"), "not a pgr store file"),
    "empty file": (replaced_by(b""), "not a pgr store file"),
    "a directory at the path": (replaced_by(None), "is a directory"),
    "member missing": (lambda p: rewrite(p, **{"vectors.npy": None}), "lacks vectors.npy"),
    "meta not JSON": (lambda p: rewrite(p, **{"meta.json": "{format"}), "meta.json in .* is damaged"),
    "meta not an object": (lambda p: rewrite(p, **{"meta.json": "[1, 2]"}), "meta.json holds a JSON list"),
    "meta lacks a key": (
        lambda p: rewrite(p, **{"meta.json": json.dumps({"format": "pgr-store/1", "dim": 256})}),
        "meta.json lacks 'embedder'",
    ),
    "wrong format": (
        lambda p: rewrite(
            p, **{"meta.json": json.dumps({"format": "pgr-store/9", "embedder": "hashing-256", "dim": 256})}
        ),
        "unknown store format 'pgr-store/9'",
    ),
    "wrong dim in meta": (
        lambda p: rewrite(
            p, **{"meta.json": json.dumps({"format": "pgr-store/1", "embedder": "hashing-256", "dim": "256"})}
        ),
        "meta.json says dim '256'",
    ),
    "bad JSON line": (lambda p: with_line(p, 3, '{"id": "s1:2", "text": '), "facts.jsonl line 3 is not valid JSON"),
    "line not an object": (lambda p: with_line(p, 2, "[1, 2, 3]"), "facts.jsonl line 2 is a JSON list, not an object"),
    "line lacks id": (
        lambda p: with_line(p, 4, json.dumps({"text": "x", "scope": {"user_id": "u1"}})),
        "facts.jsonl line 4 lacks 'id'",
    ),
    "line lacks text and scope": (
        lambda p: with_line(p, 1, json.dumps({"id": "s1:0"})),
        "facts.jsonl line 1 lacks 'text', 'scope'",
    ),
    "scope not an object": (
        lambda p: with_line(p, 1, json.dumps({"id": "a", "text": "x", "scope": "u1"})),
        "line 1: scope must be an object",
    ),
    "scope with no field": (
        lambda p: with_line(p, 1, json.dumps({"id": "a", "text": "x", "scope": {}})),
        "line 1: a Scope needs at least one",
    ),
    "position as a string": (
        lambda p: with_line(
            p, 2, json.dumps({"id": "a", "text": "x", "scope": {"user_id": "u1"}, "session_id": "s", "position": "3"})
        ),
        "line 2: fact 'a': position must be an integer",
    ),
    "unreadable date": (
        lambda p: with_line(
            p, 2, json.dumps({"id": "a", "text": "x", "scope": {"user_id": "u1"}, "date": "last Tuesday"})
        ),
        "line 2: date 'last Tuesday'",
    ),
    "metadata not an object": (
        lambda p: with_line(
            p, 2, json.dumps({"id": "a", "text": "x", "scope": {"user_id": "u1"}, "metadata": [["k", 1]]})
        ),
        "line 2: metadata must be an object",
    ),
    "NaN in metadata": (
        lambda p: with_line(p, 2, '{"id": "a", "text": "x", "scope": {"user_id": "u1"}, "metadata": {"x": NaN}}'),
        "line 2: fact 'a': metadata must be JSON",
    ),
    "one id, two owners": (
        lambda p: with_line(p, 16, json.dumps({"id": "s1:0", "text": "x", "scope": {"user_id": "u2"}})),
        "belongs to another owner",
    ),
    "vectors of the wrong dim": (
        lambda p: rewrite(p, **{"vectors.npy": npy(np.ones((16, 8), np.float32))}),
        r"vectors.npy holds an array of shape \(16, 8\).*\(16, 256\) was expected",
    ),
    "too few vectors": (
        lambda p: rewrite(p, **{"vectors.npy": npy(np.ones((15, 256), np.float32))}),
        r"shape \(15, 256\), but the file has 16 facts",
    ),
    "one-dimensional vectors": (
        lambda p: rewrite(p, **{"vectors.npy": npy(np.ones(256, np.float32))}),
        r"shape \(256,\)",
    ),
    "NaN vector": (
        lambda p: rewrite(
            p, **{"vectors.npy": npy(np.where(np.arange(16)[:, None] == 5, np.nan, np.ones((16, 256), np.float32)))}
        ),
        "vectors.npy row 5 .*fact 's2:1'.* NaN",
    ),
    "text vectors": (lambda p: rewrite(p, **{"vectors.npy": npy(np.full((16, 256), "x"))}), "not numbers"),
    "pickled vectors": (
        lambda p: rewrite(p, **{"vectors.npy": npy(np.array([{"a": 1}] * 16, dtype=object))}),
        "vectors.npy in .* is damaged",
    ),
    "mixed naive and aware dates": (
        lambda p: with_line(
            p, 2, json.dumps({"id": "a", "text": "x", "scope": {"user_id": "u1"}, "date": "2025-03-01T10:00:00+02:00"})
        ),
        "timezone-aware date",
    ),
}


@pytest.mark.parametrize("fault", list(FILE_FAULTS))
def test_a_damaged_file_is_a_configuration_error_naming_it(fault: str, tmp_path: Path) -> None:
    damage, message = FILE_FAULTS[fault]
    path = damage(saved(tmp_path))
    with pytest.raises(ConfigurationError, match=message) as caught:
        InMemoryStore.load(path, embedder=HashingEmbedder())
    assert str(path) in str(caught.value)
    assert type(caught.value) is ConfigurationError  # not a raw zipfile/zlib/json/numpy error, nor a subclass


def test_any_single_flipped_byte_or_truncation_loads_or_is_a_configuration_error(tmp_path: Path) -> None:
    path = saved(tmp_path)
    data = path.read_bytes()
    expected = contents(InMemoryStore.load(path, embedder=HashingEmbedder()))
    target = tmp_path / "x.pgr"
    refused = 0
    for damaged in [data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :] for i in range(0, len(data), 3)] + [
        data[:n] for n in range(0, len(data), 97)
    ]:
        target.write_bytes(damaged)
        try:
            loaded = InMemoryStore.load(target, embedder=HashingEmbedder())
        except ConfigurationError:
            refused += 1
        else:  # a flip in a field nothing reads (a timestamp): the store is whole
            assert contents(loaded) == expected
    assert refused > 0


# ---------------------------------------------------------------- processes


def writer_store(tag: str, n: int) -> InMemoryStore:
    store = InMemoryStore(embedder=HashingEmbedder(), embedding_cache=0)
    owner = Scope(user_id=f"writer-{tag}")
    store.add_facts(
        [
            Fact(
                id=f"{tag}:{i}",
                text=f"{tag} wrote fact number {i} about knees and buses",
                scope=owner,
                date=datetime(2025, 1, 1 + i % 28),
                session_id="s",
                position=i,
            )
            for i in range(n)
        ]
    )
    return store


def save_repeatedly(path: str, tag: str, n: int, times: int, started: Any) -> None:
    store = writer_store(tag, n)
    for i in range(times):
        store.save(path)
        if i == 0 and started is not None:
            started.set()


def save_forever(path: str, n: int, started: Any) -> None:
    store = writer_store("k", n)
    while True:
        store.save(path)
        started.set()


def load_until(path: str, stop: Any, out: Any) -> None:
    loads, errors, seen = 0, [], set()
    while not stop.is_set() or loads == 0:
        try:
            store = InMemoryStore.load(path, embedder=HashingEmbedder())
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        else:
            loads += 1
            seen.add(tuple(sorted(f.id for f in store.facts)))
    out.put((loads, errors, sorted(seen)))


def expected_ids(tag: str, n: int) -> tuple[str, ...]:
    return tuple(sorted(f"{tag}:{i}" for i in range(n)))


def test_two_processes_saving_one_path_never_fail_and_leave_one_whole_store(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.pgr")
    sizes = {"a": 300, "b": 500}
    procs = [SPAWN.Process(target=save_repeatedly, args=(path, tag, n, 25, None)) for tag, n in sizes.items()]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0]
    loaded = InMemoryStore.load(path, embedder=HashingEmbedder())
    tag = loaded.facts[0].id.split(":")[0]
    assert contents(loaded) == contents(writer_store(tag, sizes[tag]))
    assert sorted(os.listdir(tmp_path)) == ["shared.pgr", "shared.pgr.lock"]  # no temporary left behind


def test_a_reader_loading_while_a_writer_saves_never_sees_an_error(tmp_path: Path) -> None:
    path = str(tmp_path / "read.pgr")
    writer_store("first", 200).save(path)
    stop, out = SPAWN.Event(), SPAWN.Queue()
    reader = SPAWN.Process(target=load_until, args=(path, stop, out))
    reader.start()
    writer = SPAWN.Process(target=save_repeatedly, args=(path, "second", 400, 40, None))
    writer.start()
    writer.join(timeout=300)
    stop.set()
    loads, errors, seen = out.get(timeout=300)
    reader.join(timeout=60)
    assert writer.exitcode == 0 and errors == [] and loads > 0
    assert set(seen) <= {expected_ids("first", 200), expected_ids("second", 400)}  # only whole stores


@pytest.mark.parametrize("round_", range(3))
def test_a_save_killed_with_sigkill_leaves_a_file_that_loads(tmp_path: Path, round_: int) -> None:
    path = tmp_path / "killed.pgr"
    writer_store("old", 50).save(path)
    started = SPAWN.Event()
    proc = SPAWN.Process(target=save_forever, args=(str(path), 3000, started))
    proc.start()
    assert started.wait(timeout=300)
    started.clear()
    for _ in range(round_):  # a few more saves, so the kill lands somewhere else in one
        assert started.wait(timeout=300)
        started.clear()
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=60)
    assert proc.exitcode == -signal.SIGKILL
    loaded = InMemoryStore.load(path, embedder=HashingEmbedder())
    assert contents(loaded) == contents(writer_store("k", 3000))
    # the dead writer's lock is gone with it, and the next save clears any temporary it left
    writer_store("after", 10).save(path)
    assert sorted(os.listdir(tmp_path)) == ["killed.pgr", "killed.pgr.lock"]
    assert len(InMemoryStore.load(path, embedder=HashingEmbedder())) == 10
