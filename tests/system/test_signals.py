"""rlzoo.system.signals: SIGTERM as Ctrl-C, once, and never in the middle of a shielded block
(the loop's checkpoint write: a checkpoint that was due is completed, issue 39 finding 8)."""

from __future__ import annotations

import os
import signal

import pytest

from rlzoo.system.signals import EXIT_TERMINATED, Terminated, shielded, terminate_as_interrupt


def test_sigterm_raises_terminated_a_keyboard_interrupt() -> None:
    assert EXIT_TERMINATED == 143 and issubclass(Terminated, KeyboardInterrupt)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated), terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between bytecodes of the main thread
            pass
    assert signal.getsignal(signal.SIGTERM) == before  # restored


def test_a_sigterm_inside_a_shielded_block_waits_for_its_end() -> None:
    done = []
    with pytest.raises(Terminated), terminate_as_interrupt(), shielded():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass
        done.append("checkpoint written")  # reached: the signal did not cut the block
    assert done == ["checkpoint written"]
