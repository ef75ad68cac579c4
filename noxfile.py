"""nox sessions: `tests` (the default suite, CI) and `llm` (against a real OpenAI-compatible server).

    nox -s tests        # what CI runs
    nox -s llm          # needs PGR_LLM_BASE_URL, or ../shared/tools/local-llm serve on 127.0.0.1:8081
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

# Installed first, on its own: the CPU wheel that lies on these machines' disk. Left to resolve it as a
# dependency of sentence-transformers, pip would fetch a CUDA build of several GB.
TORCH = "torch==2.13.0"


def _install(session: nox.Session, extras: str) -> None:
    if os.path.isdir("/opt/wheels"):
        session.env["PIP_FIND_LINKS"] = "/opt/wheels"
    session.install(TORCH)
    session.install("-e", f".[{extras}]")


@nox.session
def tests(session: nox.Session) -> None:
    """The default suite: unit tests, the CLI demo on MiniLM, the LLM client on loopback."""
    _install(session, "local,dev")
    session.env["MEM0_TELEMETRY"] = "False"
    session.run("pytest", "-m", "not llm", *session.posargs)


@nox.session
def llm(session: nox.Session) -> None:
    """Integration tests against a real OpenAI-compatible server (skipped with a reason when none answers)."""
    _install(session, "local,dev")
    session.env.setdefault("PGR_LLM_BASE_URL", os.environ.get("PGR_LLM_BASE_URL", "http://127.0.0.1:8081/v1"))
    session.run("pytest", "-m", "llm", "-v", "-s", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "pgr_core", "adapters", "tests", "benchmarks")
