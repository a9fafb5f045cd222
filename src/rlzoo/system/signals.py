"""SIGTERM handled like Ctrl-C: what SLURM, Kubernetes and ``docker stop`` send before a kill -9.

:func:`terminate_as_interrupt` installs a handler that raises :class:`Terminated` (a
``KeyboardInterrupt``) in the main thread, so a SIGTERM takes the path a Ctrl-C takes: the training
loop abandons the step in progress, writes ``summary.json`` (``ended: "interrupted (SIGTERM)"``),
prints the resume command, and ``rlzoo train`` exits with :data:`EXIT_TERMINATED`. The handler
fires once: a second SIGTERM while the run shuts down is ignored (a scheduler's kill -9 follows
its grace period anyway), so the summary is not cut short. Inside :func:`shielded` (a checkpoint
being written) a SIGTERM waits until the block ends, so a checkpoint that was due is completed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

#: exit status of a run stopped by SIGTERM (128 + 15, the shell's convention; Ctrl-C: 130)
EXIT_TERMINATED = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when the process receives SIGTERM (see :func:`terminate_as_interrupt`)."""


_shield = {"depth": 0, "pending": False}


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    del frame
    signal.signal(signum, signal.SIG_IGN)  # once: the shutdown that follows is not interrupted again
    if _shield["depth"]:
        _shield["pending"] = True  # raised when the shielded block ends
        return
    raise Terminated(f"received {signal.Signals(signum).name}")


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """A block a SIGTERM does not cut short (the loop's checkpoint write): :class:`Terminated` is
    raised when it ends instead. Ctrl-C is not held back."""
    _shield["depth"] += 1
    try:
        yield
    finally:
        _shield["depth"] -= 1
    if not _shield["depth"] and _shield["pending"]:
        _shield["pending"] = False
        raise Terminated("received SIGTERM")


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`Terminated` in the main thread; the previous handler is
    restored on the way out. Outside the main thread (where Python cannot install handlers) a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
