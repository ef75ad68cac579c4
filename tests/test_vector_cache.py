"""The eval's disk vector cache (what it keys on, what it survives), the store's own vectors reused for
the baseline lists, and the progress lines of a run's embedding steps."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import U1, make_store

from pgr_core import HashingEmbedder, InMemoryStore
from pgr_core.errors import InvalidArgumentError
from pgr_core.evaluation import EvalQuestion, EvalSet, run_eval
from pgr_core.evaluation.cache import VECTOR_FILE, DiskCachedEmbedder, disk_cached_embedder, embedder_identity
from pgr_core.evaluation.runner import _closeness, build_store
from pgr_core.models.caches import CachedEmbedder


class Counting:
    """A tiny embedder that records every text it is asked to embed (hashing vectors underneath)."""

    def __init__(self, name: str = "fake", dim: int = 16) -> None:
        self.name, self.dim = name, dim
        self.calls: list[list[str]] = []
        self._hashing = HashingEmbedder(dim)

    @property
    def texts(self) -> list[str]:
        return [t for call in self.calls for t in call]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return self._hashing.embed(texts)


def test_a_second_embedding_of_the_same_texts_asks_the_model_nothing(tmp_path: Path) -> None:
    inner = Counting()
    first = DiskCachedEmbedder(inner, tmp_path).embed(["knee", "bus", "knee"])
    assert inner.calls == [["knee", "bus"]]  # repeats within a call are embedded once
    again = Counting()
    disk = DiskCachedEmbedder(again, tmp_path)  # a new process, the same folder
    second = disk.embed(["bus", "knee"])
    assert again.calls == [] and (disk.hits, disk.misses) == (2, 0)
    np.testing.assert_array_equal(second, first[[1, 0]])
    assert second.dtype == np.float32 and second.shape == (2, 16)
    # a mix: only the new text reaches the model
    disk.embed(["knee", "rent"])
    assert again.calls == [["rent"]]


def test_embedders_of_other_names_or_dims_share_no_entries(tmp_path: Path) -> None:
    DiskCachedEmbedder(Counting("fake", 16), tmp_path).embed(["knee"])
    for other in (Counting("other", 16), Counting("fake", 8)):
        vectors = DiskCachedEmbedder(other, tmp_path).embed(["knee"])
        assert other.calls == [["knee"]] and vectors.shape == (1, other.dim)
    assert len({embedder_identity(e) for e in (Counting("fake", 16), Counting("other", 16), Counting("fake", 8))}) == 3


def test_a_corrupt_cache_file_is_set_aside_with_a_warning(tmp_path: Path) -> None:
    (tmp_path / VECTOR_FILE).write_bytes(b"this is no database" * 100)
    inner = Counting()
    with pytest.warns(RuntimeWarning, match="unreadable"):
        disk = DiskCachedEmbedder(inner, tmp_path)
    assert disk.active and (tmp_path / f"{VECTOR_FILE}.corrupt").read_bytes().startswith(b"this is no database")
    np.testing.assert_array_equal(disk.embed(["knee"]), HashingEmbedder(16).embed(["knee"]))
    disk.close()
    fresh = Counting()
    DiskCachedEmbedder(fresh, tmp_path).embed(["knee"])  # the new file works
    assert fresh.calls == []


def test_an_unusable_cache_folder_means_embedding_without_a_cache(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    inner = Counting()
    with pytest.warns(RuntimeWarning, match="embedding without it"):
        disk = DiskCachedEmbedder(inner, blocker)
    assert not disk.active
    disk.embed(["knee"])
    disk.embed(["knee"])
    assert inner.calls == [["knee"], ["knee"]]


def test_a_torn_row_is_embedded_again(tmp_path: Path) -> None:
    disk = DiskCachedEmbedder(Counting(), tmp_path)
    disk.embed(["knee"])
    disk.close()
    with sqlite3.connect(tmp_path / VECTOR_FILE) as db:
        db.execute("UPDATE vectors SET vector = ?", (b"\x00" * 10,))
    db.close()
    inner = Counting()
    vectors = DiskCachedEmbedder(inner, tmp_path).embed(["knee"])
    assert inner.calls == [["knee"]]
    np.testing.assert_array_equal(vectors, HashingEmbedder(16).embed(["knee"]))


def test_the_disk_cache_needs_a_dimension(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="dim"):
        DiskCachedEmbedder(Counting(dim=0), tmp_path)


def test_the_memory_cache_sits_on_the_disk_cache_and_keeps_its_size(tmp_path: Path) -> None:
    inner = Counting()
    cached = disk_cached_embedder(CachedEmbedder(inner, max_entries=7), tmp_path)
    assert cached.max_entries == 7 and isinstance(cached.inner, DiskCachedEmbedder) and cached.inner.inner is inner
    assert (cached.name, cached.dim) == ("fake", 16)
    plain = disk_cached_embedder(inner, tmp_path)
    assert isinstance(plain.inner, DiskCachedEmbedder) and plain.inner.inner is inner


def test_vectors_for_gives_the_stored_rows_and_names_an_unknown_id() -> None:
    store = make_store()
    rows = store.vectors_for(["s1:3", "s1:0"], scope=U1)
    texts = [store.get("s1:3", scope=U1).text, store.get("s1:0", scope=U1).text]  # type: ignore[union-attr]
    np.testing.assert_allclose(rows, HashingEmbedder().embed(texts))
    assert store.vectors_for([], scope=U1).shape == (0, store.embedder.dim)
    with pytest.raises(KeyError, match="nope"):
        store.vectors_for(["s1:0", "nope"], scope=U1)


def _questions() -> list[EvalQuestion]:
    return [
        EvalQuestion(id="knee", question="knee basketball", scope=U1, gold=["s1:0"], category="health"),
        EvalQuestion(id="car", question="sold my car bus", scope=U1, gold=[["s1:3", "s2:0"]], category="logistics"),
        EvalQuestion(id="none", question="no gold", scope=U1, gold=[], category="x"),
    ]


def test_closeness_reuses_the_store_vectors_and_matches_embedding_afresh(capsys: pytest.CaptureFixture[str]) -> None:
    facts = make_store().facts
    inner = Counting("hashing-like", 256)
    store = build_store(facts, inner)
    assert "embedding facts" in capsys.readouterr().err
    inner.calls.clear()
    questions = _questions()
    close = _closeness(store, questions)
    assert set(inner.texts) == {q.question for q in questions}  # no gold fact embedded again
    assert "baseline lists: gold closeness: 3/3" in capsys.readouterr().err

    class NoVectors(InMemoryStore):  # a store that cannot give its vectors: the gold is embedded
        capabilities = replace(InMemoryStore.capabilities, vectors=False)

    counted = Counting("hashing-like", 256)
    other = NoVectors(embedder=counted)
    other.add_facts(facts)
    counted.calls.clear()
    assert _closeness(other, questions) == pytest.approx(close)
    assert {"I hurt my knee playing basketball in March", "I sold my car and ride the bus now"} <= set(counted.texts)
    assert close[2] is None and close[0] == pytest.approx(
        float(HashingEmbedder().embed(["knee basketball"])[0] @ store.vectors_for(["s1:0"], scope=U1)[0])
    )


def test_build_store_embeds_in_chunks_with_progress(capsys: pytest.CaptureFixture[str]) -> None:
    facts = make_store().facts
    inner = Counting()
    store = build_store(facts, inner, chunk=5)
    assert len(store) == len(facts) and [len(c) for c in inner.calls] == [5, 5, 5, 1]
    assert f"embedding facts (fake): {len(facts)}/{len(facts)}" in capsys.readouterr().err
    np.testing.assert_array_equal(
        store.vectors_for([facts[7].id], scope=facts[7].scope)[0], HashingEmbedder(16).embed([facts[7].text])[0]
    )
    rows = run_eval(EvalSet("t", facts, _questions()[:2]), ["query-only"], store, log=lambda s: None)
    assert {r["question"] for r in rows if r["method"] == "query-only"} == {"knee", "car"}


def _dataset(path: Path) -> Path:
    line = {
        "user_id": "u",
        "facts": [{"id": f"f{i}", "text": t} for i, t in enumerate(["knee hurts", "sold the car", "rent is up"])],
        "queries": [{"query": "my knee", "references": [{"text": "knee", "fact_ids": ["f0"]}]}],
    }
    path.write_text(json.dumps(line) + "\n", encoding="utf-8")
    return path


def test_a_second_pgr_eval_embeds_nothing_and_no_cache_writes_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pgr_core.cli.main import main

    data, vectors = _dataset(tmp_path / "d.jsonl"), tmp_path / "vectors"
    common = ["eval", "jsonl", "--data", str(data), "--embedder", "hashing", "--no-llm", "--methods", "query-only"]
    assert main([*common, "--json", str(tmp_path / "a.json"), "--vector-cache", str(vectors)]) == 0
    first = json.loads((tmp_path / "a.json").read_text())["vector_cache"]
    assert first["misses"] > 0 and first["active"] and (vectors / VECTOR_FILE).exists()
    capsys.readouterr()
    assert main([*common, "--json", str(tmp_path / "b.json"), "--vector-cache", str(vectors)]) == 0
    second = json.loads((tmp_path / "b.json").read_text())["vector_cache"]
    assert second["misses"] == 0 and second["hits"] > 0  # facts, questions and probes: all from disk
    err = capsys.readouterr().err
    assert "3 from the vector cache" in err and "embedding facts" in err and "baseline lists" in err
    off = tmp_path / "off"
    assert main([*common, "--json", str(tmp_path / "c.json"), "--vector-cache", str(off), "--no-cache"]) == 0
    assert "vector_cache" not in json.loads((tmp_path / "c.json").read_text()) and not off.exists()
