"""Subcommands a plugin adds to the ``rlzoo`` command line (the ``rlzoo_cli_commands`` hook)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class CliCommand:
    """One ``rlzoo NAME ...`` subcommand.

    ``add_arguments(parser)`` declares its arguments; ``run(namespace) -> exit code`` does the work
    (an :class:`rlzoo.RlzooError` it raises is printed as ``rlzoo NAME: error: ...``, exit 2);
    ``examples`` ends its ``--help``.
    """

    name: str
    summary: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    examples: str = ""
