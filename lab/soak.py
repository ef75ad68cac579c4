"""Soak: several `pgr ingest` processes on one store, a reader between them, and random `kill -9`s.

    python lab/soak.py --seconds 120 [--writers 4] [--store DIR_OR_FILE.pgr] [--json out.json]

What it does, for ``--seconds`` (bounded; run by ``nox -s soak``, not in CI):

- writes a synthetic JSONL data set (``--users`` users × dated sessions of ``--turns`` short turns)
  that grows as the soak goes on: each writer started gets the sessions so far plus ``--grow`` more
  (up to ``--sessions``), so a restarted writer skips what the ledger holds and writes new sessions;
- keeps ``--writers`` ``pgr ingest`` processes running on the SAME store, each on its own slice of
  the users plus one user shared by all (so they contend on the lock and on the same sessions); each
  waits for the store's lock (``--lock-timeout``) and resumes from the ledger when restarted;
- between them, a reader process opens the store and searches it (``pgr retrieve``);
- a killer sends SIGKILL to a random running writer every ``--kill-every`` seconds on average (a
  writer killed is restarted);
- at the end, once every writer has run to completion unkilled, it opens the store and checks that
  every session the ledger lists as ingested is present exactly once: each of its fact ids is in the
  store, and no (user, session, position) is held by two facts.

- then, for a directory store, damages copies of it the way a disk or a careless hand would (a
  flipped byte in the engine's write-ahead log, a truncated log, a truncated id map, an emptied
  segment, the record of acknowledged facts deleted) and checks each: ``pgr store check`` names the
  damage, opening refuses with DamagedStoreError (a store that opens short of what it acknowledged is
  a *silent* loss: a failure), ``pgr store repair`` keeps every fact still there and lists the rest
  (kept + lost = acknowledged), and the repaired copy opens and checks whole.

It prints the counts (processes started, kills, reader opens and failures, sessions in the ledger,
facts lost, facts duplicated, damage cases refused / silent / repaired) and exits non-zero when
anything was lost or duplicated, the store failed to reopen, or a damage case went unnoticed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

WORDS = (
    "knee physio run trip car train lab Friday mother birthday budget dog flight shift rent class "
    "garden allergy doctor coffee bike exam visa paint concert hike"
).split()


def write_data(path: Path, users: int, sessions: int, turns: int, seed: int) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for u in range(users):
            rows = []
            for s in range(sessions):
                rng = random.Random(seed * 1_000_003 + u * 10_007 + s)  # a session's text never changes
                day = 1 + s % 28
                rows.append(
                    {
                        "id": f"s{s:03d}",
                        "date": f"2025-{1 + s // 28 % 12:02d}-{day:02d}",
                        "turns": [
                            {
                                "speaker": "user" if t % 2 == 0 else "assistant",
                                "text": f"u{u} s{s} t{t}: " + " ".join(rng.choice(WORDS) for _ in range(8)),
                            }
                            for t in range(turns)
                        ],
                    }
                )
            fh.write(json.dumps({"user_id": f"u{u:02d}", "sessions": rows}) + "\n")


def ingest_cmd(data: Path, store: Path, users: list[str], lock_timeout: float) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "pgr_core.cli.main",
        "ingest",
        "jsonl",
        "--data",
        str(data),
        "--out",
        str(store),
        "--embedder",
        "hashing",
        "--no-progress",
        "--checkpoint-every",
        "3",
        "--lock-timeout",
        str(lock_timeout),
    ]
    for user in users:
        cmd += ["--user", user]
    return cmd


def open_store(store: Path) -> tuple[Any, Any]:
    """(store, ledger) as `pgr ingest` left them, through the library's own openers."""
    from pgr_core import HashingEmbedder
    from pgr_core.stores.builtin import is_file_store, open_store
    from pgr_core.write.ledger import ledger_path_for, open_ledger

    opened = open_store(store, HashingEmbedder(), create=False, lock_timeout_s=120)
    return opened, open_ledger(ledger_path_for(store, directory=not is_file_store(store)))


def check(store_path: Path) -> dict[str, int]:
    from pgr_core import Scope

    store, ledger = open_store(store_path)
    try:
        entries = [e for e in ledger.entries() if e.status in ("ok", "raw")]
        lost = dup = 0
        held: Counter[tuple[str, str, int]] = Counter()
        seen_users: set[str] = set()
        for e in entries:
            user, agent, run = e.owner or (e.scope, None, None)
            scope = Scope(user_id=user, agent_id=agent, run_id=run)
            for fid in e.facts:
                if store.get(fid, scope=scope) is None:
                    lost += 1
            if scope.user_id not in seen_users:
                seen_users.add(scope.user_id or "")
                for f in store.facts_for(scope):
                    if f.session_id is not None and f.position is not None:
                        held[(scope.user_id or "", f.session_id, f.position)] += 1
        dup = sum(n - 1 for n in held.values() if n > 1)
        return {
            "sessions_in_ledger": len(entries),
            "facts_in_ledger": sum(len(e.facts) for e in entries),
            "facts_lost": lost,
            "facts_duplicated": dup,
        }
    finally:
        ledger.close()
        close = getattr(store, "close", None)
        if close:
            close()


def _used_end(path: Path) -> int:
    """Where a preallocated file's written part ends (its last non-zero byte, plus one)."""
    data = path.read_bytes()
    return len(data.rstrip(b"\0"))


def _harm(copy: Path, kind: str, rng: random.Random) -> bool:
    """Damage the store copy; False when it has nothing of that kind to damage."""
    shard = copy / "shard"
    if kind.startswith("log-"):
        logs = [p for p in sorted((shard / "wal").glob("open-*")) if _used_end(p) > 64]
        if not logs:
            return False
        data, end = bytearray(logs[0].read_bytes()), _used_end(logs[0])
        if kind == "log-byte":
            data[rng.randrange(32, end)] ^= 1 << rng.randrange(8)
        else:  # log-truncated
            data = data[: end // 2]
        logs[0].write_bytes(bytes(data))
    elif kind == "id-map":
        maps = sorted((shard / "segments").glob("*/mutable_id_tracker.mappings"), key=lambda p: -p.stat().st_size)
        if not maps or maps[0].stat().st_size < 2:
            return False
        maps[0].write_bytes(maps[0].read_bytes()[: maps[0].stat().st_size // 3])
    elif kind == "segment-emptied":
        segments = sorted(p for p in (shard / "segments").iterdir() if p.is_dir())
        if not segments:
            return False
        victim = rng.choice(segments)
        shutil.rmtree(victim)
        victim.mkdir()
    elif kind == "record-deleted":
        (copy / "acknowledged.sqlite3").unlink()
    return True


DAMAGE = ("log-byte", "log-truncated", "id-map", "segment-emptied", "record-deleted")


def damage_round(store: Path, workdir: Path, seed: int) -> dict[str, Any]:
    """Each kind of damage on its own copy of the (closed) store: refused, checked, repaired."""
    from pgr_core import DamagedStoreError, EdgeStore, HashingEmbedder

    acknowledged = EdgeStore.check(store)["acknowledged"]
    rng = random.Random(seed)
    cli = [sys.executable, "-m", "pgr_core.cli.main", "store"]
    out: dict[str, Any] = {"acknowledged": acknowledged, "refused": 0, "silent": 0, "harmless": 0, "repaired": 0}
    for kind in DAMAGE:
        copy = workdir / f"damaged-{kind}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(store, copy, ignore=shutil.ignore_patterns(".lock"))
        if not _harm(copy, kind, rng):
            out[kind] = "nothing to damage"
            continue
        checked = subprocess.run([*cli, "check", str(copy)], capture_output=True, text=True)
        try:
            with EdgeStore.open(copy, embedder=HashingEmbedder()) as opened:
                held = len(opened)
        except DamagedStoreError:
            out["refused"] += 1
        else:  # it opened: only right if nothing it acknowledged is gone
            whole = held >= acknowledged and checked.returncode == 0
            out["harmless" if whole else "silent"] += 1
            out[kind] = "opened whole" if whole else f"SILENT: opened with {held} of {acknowledged}"
            continue
        repaired = subprocess.run([*cli, "repair", str(copy), "--json", str(copy) + ".json"], capture_output=True)
        report = json.loads(Path(str(copy) + ".json").read_text())[0] if repaired.returncode == 0 else {}
        with EdgeStore.open(copy, embedder=HashingEmbedder()) as opened:
            kept = len(opened)
        after = subprocess.run([*cli, "check", str(copy)], capture_output=True)
        lost = len(report.get("lost", []))
        sums = report.get("lost_unknown") or kept + lost == acknowledged
        ok = checked.returncode == 1 and repaired.returncode == 0 and after.returncode == 0 and sums
        out["repaired"] += int(ok)
        out[kind] = f"refused; repair kept {kept}, listed {lost} lost" + ("" if ok else " (FAILED)")
        shutil.rmtree(copy, ignore_errors=True)
    out["ok"] = out["silent"] == 0 and out["repaired"] == out["refused"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120.0, help="how long to keep killing (120)")
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--users", type=int, default=9)
    ap.add_argument("--sessions", type=int, default=400, help="most sessions per user (400)")
    ap.add_argument("--grow", type=int, default=4, help="sessions per user added at each writer start (4)")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--kill-every", type=float, default=3.0, help="mean seconds between kills (3)")
    ap.add_argument("--lock-timeout", type=float, default=120.0)
    ap.add_argument("--store", type=Path, default=None, help="the store (default: a new directory store)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="pgr-soak-"))
    generation = {"sessions": 0, "n": 0}

    def next_data() -> Path:
        generation["sessions"] = min(args.sessions, generation["sessions"] + args.grow)
        generation["n"] += 1
        path = work / f"soak-{generation['n']}.jsonl"
        write_data(path, args.users, generation["sessions"], args.turns, args.seed)
        return path

    store = args.store or (work / "store")
    users = [f"u{u:02d}" for u in range(args.users)]
    shared = users[-1]
    slices = [[u for i, u in enumerate(users[:-1]) if i % args.writers == w] + [shared] for w in range(args.writers)]
    env = {**os.environ, "MEM0_TELEMETRY": "False"}
    counts = Counter()
    procs: dict[int, subprocess.Popen[bytes]] = {}
    logs = work / "logs"
    logs.mkdir()

    def start(w: int) -> None:
        log = (logs / f"w{w}-{counts['started']}.log").open("wb")
        procs[w] = subprocess.Popen(
            ingest_cmd(next_data(), store, slices[w], args.lock_timeout), stdout=log, stderr=subprocess.STDOUT, env=env
        )
        counts["started"] += 1

    t0 = time.monotonic()
    for w in range(args.writers):
        start(w)
    next_kill = t0 + rng.expovariate(1 / args.kill_every)
    next_read = t0 + 1.0
    print(
        f"soak: {args.writers} writers, {args.users} users, sessions growing by {args.grow} per start, into {store}",
        flush=True,
    )
    while time.monotonic() - t0 < args.seconds:
        now = time.monotonic()
        for w, p in list(procs.items()):
            rc = p.poll()
            if rc is not None:
                counts["exited_ok" if rc == 0 else f"exited_rc{rc}"] += 1
                start(w)  # keep the writers busy: a finished one starts over (a no-op resume) until time is up
        if now >= next_kill:
            w = rng.choice(list(procs))
            procs[w].send_signal(signal.SIGKILL)
            procs[w].wait()
            counts["kills"] += 1
            start(w)
            next_kill = now + rng.expovariate(1 / args.kill_every)
        if now >= next_read:
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pgr_core.cli.main",
                    "retrieve",
                    "what about the knee?",
                    "--store",
                    str(store),
                    "--user",
                    shared,
                    "--embedder",
                    "hashing",
                ],
                capture_output=True,
                env=env,
                timeout=args.lock_timeout + 60,
            )
            counts["reads_ok" if r.returncode == 0 else "reads_failed"] += 1
            if r.returncode != 0:
                (logs / f"read-{counts['reads_failed']}.log").write_bytes(r.stdout + r.stderr)
            next_read = time.monotonic() + 1.0
        time.sleep(0.05)
        elapsed = int(time.monotonic() - t0)
        if elapsed and elapsed % 15 == 0 and counts["_last"] != elapsed:
            counts["_last"] = elapsed
            print(
                f"  {elapsed}s: {counts['started']} started, {counts['kills']} killed, "
                f"{counts['reads_ok']} reads ok, {counts['reads_failed']} failed",
                flush=True,
            )
    print("soak: time is up; letting every writer finish unkilled", flush=True)
    for p in procs.values():
        p.wait()
        counts["exited_ok" if p.returncode == 0 else f"exited_rc{p.returncode}"] += 1
    final = subprocess.run(ingest_cmd(next_data(), store, users, args.lock_timeout), capture_output=True, env=env)
    counts["sessions_per_user_at_end"] = generation["sessions"]
    counts["final_ingest_rc"] = final.returncode
    try:
        result = check(store)
        result["reopened"] = 1
    except Exception as exc:  # the point of the soak: a store that does not reopen is a failure, reported
        result = {"reopened": 0, "error": f"{type(exc).__name__}: {exc}"}  # type: ignore[dict-item]
    counts.pop("_last", None)
    damage: dict[str, Any] = {}
    if result.get("reopened") and store.is_dir():
        damage = damage_round(store, Path(logs).parent, args.seed)
    summary = {**dict(counts), **result, "damage": damage, "store": str(store), "logs": str(logs)}
    for key, value in summary.items():
        print(f"  {key}: {value}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2), encoding="utf-8")
    bad = (
        not result.get("reopened")
        or result.get("facts_lost", 1)
        or result.get("facts_duplicated", 1)
        or counts.get("reads_failed", 0)
        or final.returncode != 0
        or (damage and not damage["ok"])
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
