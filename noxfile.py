"""nox sessions.

nox                          # what CI runs: `tests` and every `conformance(<adapter>)`
nox -s tests                 # the default suite (no framework installed)
nox -s "conformance(qdrant)" # one adapter: installs only its extra, loads only its entry point
nox -s llm                   # needs PGR_LLM_BASE_URL, or ../shared/tools/local-llm serve on :8081
nox -s soak                  # writers, a reader and kill -9s on one store (bounded; not in CI)
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["tests", "conformance"]
# uv where it is installed (`pip install 'nox[uv]'`): its one package cache links each package into every
# session instead of copying it (torch alone is about 1 GB a session); plain venv otherwise
nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_existing_virtualenvs = True

# Installed first, on its own: the CPU wheel that lies on these machines' disk. Left to resolve it as a
# dependency of sentence-transformers, pip or uv would fetch a CUDA build of several GB.
TORCH = "torch==2.13.0"
WHEELS = "/opt/wheels"


def _install(session: nox.Session, extras: str, *more: str) -> None:
    torch = TORCH
    if os.path.isdir(WHEELS):
        session.env["PIP_FIND_LINKS"] = WHEELS
        local = sorted(f for f in os.listdir(WHEELS) if f.startswith(TORCH.replace("==", "-") + "+cpu"))
        if local:  # the file itself: uv would otherwise prefer the index's CUDA build of the same version
            torch = os.path.join(WHEELS, local[-1])
    session.install(torch)
    session.install("-e", f".[{extras}]", *more)


@nox.session
def tests(session: nox.Session) -> None:
    """The default suite: unit tests, the CLI demo on MiniLM, the LLM client on loopback."""
    _install(session, "local,dev")
    session.env["MEM0_TELEMETRY"] = "False"
    session.run("pytest", "-m", "not llm", *session.posargs)


# adapter -> (extra, extra packages, entry point to load, test file)
ADAPTERS = {
    "qdrant": ("qdrant", (), "qdrant", "tests/adapters/test_adapter_qdrant.py"),
    "mem0": ("mem0", ("mem0ai>=2,<3",), "mem0", "tests/adapters/test_adapter_mem0.py tests/adapters/test_eval_mem0.py"),
    # graph memory exists only in mem0ai 1.0.x; kuzu runs embedded
    "mem0_graph": ("dev", ("mem0ai==1.0.11", "kuzu", "rank-bm25"), "mem0", "tests/adapters/test_adapter_mem0_graph.py"),
    # the evaluation baselines (LlamaIndex QueryFusion, HyDE) are tested where llama-index-core is installed
    "llamaindex": (
        "llamaindex",
        (),
        "llamaindex",
        "tests/adapters/test_adapter_llamaindex.py tests/adapters/test_eval_baselines.py",
    ),
}


@nox.session
@nox.parametrize("adapter", list(ADAPTERS), ids=list(ADAPTERS))
def conformance(session: nox.Session, adapter: str) -> None:
    """One adapter against pgr_core.testing.conformance, with only its own extra and entry point."""
    extra, more, entry_point, test_file = ADAPTERS[adapter]
    _install(session, f"local,dev,{extra}", *more)
    session.env["MEM0_TELEMETRY"] = "False"
    session.env["PGR_LOAD_PLUGINS"] = entry_point
    session.run("pytest", *test_file.split(), *session.posargs)


@nox.session
def llm(session: nox.Session) -> None:
    """Integration tests against a real OpenAI-compatible server (skipped with a reason when none answers)."""
    _install(session, "local,dev")
    session.env.setdefault("PGR_LLM_BASE_URL", os.environ.get("PGR_LLM_BASE_URL", "http://127.0.0.1:8081/v1"))
    session.run("pytest", "-m", "llm", "-v", "-s", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "pgr_core", "adapters", "tests", "lab")


@nox.session
def gmpo(session: nox.Session) -> None:
    """GMPO's GRPO loop end to end on a tiny random Qwen2 on CPU (not a default session: `nox -s gmpo`)."""
    _install(session, "dev,train")
    session.run("pytest", "tests/test_write_gmpo.py", "-v", "-s", *session.posargs)


@nox.session
def soak(session: nox.Session) -> None:
    """Writers, a reader and random kill -9s on one store, for a bounded time (not in CI: `nox -s soak`).

    Runs lab/soak.py on a directory store and on a .pgr file store; pass its options after
    `--`, e.g. `nox -s soak -- --seconds 600`. Fails when a fact was lost or duplicated or the store
    did not reopen."""
    _install(session, "local,dev")
    args = session.posargs or ["--seconds", "120"]
    session.run("python", "lab/soak.py", *args, "--json", "soak-dir.json")
    pgr_file = os.path.join(session.create_tmp(), "soak.pgr")
    session.run("python", "lab/soak.py", *args, "--store", pgr_file, "--json", "soak-file.json")
