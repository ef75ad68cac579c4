"""``python -m pgr_core.cli``: the ``pgr`` command."""

from pgr_core.cli.main import run

run()
