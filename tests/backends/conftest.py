"""Fixtures shared by the backend tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread for the module, restored after it: tiny matmuls gain nothing from threads,
    and intra-op threads thrash on a busy CPU. A module opts in with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def torchrun(*args: str, timeout: float, what: str = "torchrun worker", nproc: int = 2, **env: str) -> str:
    """``torchrun --standalone --nproc_per_node=NPROC *args`` (one OMP thread a rank, this process's
    ``sys.path``, ``env`` added to the environment); fails the test with the tail of the output
    when it exits non-zero. Returns stdout + stderr."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path), **env}
    proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{what} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc.stdout + proc.stderr
