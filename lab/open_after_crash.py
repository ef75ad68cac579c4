"""What the record of acknowledged facts costs an EdgeStore: writing, opening after a clean close, and
opening after a ``kill -9`` (when every point id is listed and compared).

    python lab/open_after_crash.py [--facts 100000] [--batch 1000] [--json out.json]

The hashing embedder keeps the embedding out of the figures. Prints seconds for the writes, for an
open after a clean close, and for an open after the writer was killed (median of 3 opens each).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write(path: Path, facts: int, batch: int, kill: bool) -> float:
    script = textwrap.dedent(
        f"""
        import os, signal, time
        from pgr_core import EdgeStore, Fact, HashingEmbedder, Scope
        store = EdgeStore.open({str(path)!r}, embedder=HashingEmbedder(), lock_timeout_s=60)
        store.auto_optimize_at = 10**9  # the open is what is timed, not the HNSW build
        t0 = time.perf_counter()
        for start in range(0, {facts}, {batch}):
            ids = range(start, min(start + {batch}, {facts}))
            store.add_facts([Fact(id=f"f{{i}}", text=f"fact {{i}} about topic {{i % 97}}",
                                  scope=Scope(user_id=f"u{{i % 50}}")) for i in ids])
        print(time.perf_counter() - t0, flush=True)
        if {kill}:
            os.kill(os.getpid(), signal.SIGKILL)
        store.close()
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert done.returncode == (-signal.SIGKILL if kill else 0), done.stderr[-2000:]
    return float(done.stdout.split()[0])


def open_seconds(path: Path, crashed: bool) -> float:
    from pgr_core import EdgeStore, HashingEmbedder
    from pgr_core.stores._acknowledged import Acknowledged

    times = []
    for _ in range(3):
        if crashed:  # each open marks the store clean at close: mark it crashed again
            ack = Acknowledged(path)
            ack.set_state("clean", "0")
            ack.close()
        t0 = time.perf_counter()
        store = EdgeStore.open(path, embedder=HashingEmbedder())
        times.append(time.perf_counter() - t0)
        store.close()
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--facts", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        clean, crashed = Path(work) / "clean", Path(work) / "crashed"
        out = {"facts": args.facts, "batch": args.batch}
        out["write_s"] = round(write(clean, args.facts, args.batch, kill=False), 2)
        write(crashed, args.facts, args.batch, kill=True)
        out["open_after_clean_close_s"] = round(open_seconds(clean, crashed=False), 3)
        out["open_after_kill_9_s"] = round(open_seconds(crashed, crashed=True), 3)
    print(json.dumps(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
