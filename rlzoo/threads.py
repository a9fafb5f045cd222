"""How rlzoo's CPU thread pools wait: opt-in passive / short waiting for machines shared with other work.

torch's CPU kernels run on an OpenMP pool (GNU libgomp in the PyPI wheels). By default a libgomp
thread that reaches a barrier first spins for a while before it sleeps; when another process holds
one of the cores, the partner it waits for is descheduled and the spinning thread burns the CPU
that partner needs: a tiny-model run on 2 cores with one core busy took 2.4-4.5x as long, not ~2x
(benchmarks/busy.py). ``OMP_WAIT_POLICY=PASSIVE`` makes waiting threads sleep at once.

libgomp reads its environment once, when torch is imported, so :func:`choose_wait_policy` runs when
``rlzoo`` is imported (``rlzoo/__init__.py``, which imports no torch). With
``RLZOO_OMP_WAIT_POLICY=passive`` it sets ``OMP_WAIT_POLICY=PASSIVE``, with ``short``
``GOMP_SPINCOUNT=10000`` (spin briefly, then sleep; libgomp's default is 300,000 spins), unless the
user set ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``; by default (``keep``) it changes nothing. Passive is
not the default because on a quiet 2-core machine it made the quickstart slower (18.4 s against
10.5 s for 15 steps, docs/performance.md: waking a sleeping thread for every small kernel costs
more than the spin). A program that imported torch before rlzoo keeps torch's waiting. The thread
count stays torch's default (``OMP_NUM_THREADS`` / ``torch.set_num_threads`` change it).
"""

from __future__ import annotations

import os
import sys

__all__ = ["DEFAULT_WAIT_POLICY", "WAIT_POLICIES", "choose_wait_policy"]

# RLZOO_OMP_WAIT_POLICY -> the libgomp variables it sets (docs/performance.md, benchmarks/busy.py)
WAIT_POLICIES: dict[str, dict[str, str]] = {
    "keep": {},  # libgomp's own: spin 300,000 times in a barrier, then sleep
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},  # sleep at once
    "short": {"GOMP_SPINCOUNT": "10000"},  # spin briefly, then sleep
}
DEFAULT_WAIT_POLICY = "keep"


def choose_wait_policy(environ: dict[str, str] | None = None) -> dict[str, str] | None:
    """Set the OpenMP variables of ``RLZOO_OMP_WAIT_POLICY`` (:data:`WAIT_POLICIES`, default
    :data:`DEFAULT_WAIT_POLICY`) in ``environ`` (default ``os.environ``) unless the user chose an
    OpenMP policy (``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` set); returns what was set, or None
    when nothing was."""
    env = os.environ if environ is None else environ
    choice = env.get("RLZOO_OMP_WAIT_POLICY", DEFAULT_WAIT_POLICY).lower()
    if choice not in WAIT_POLICIES:
        raise ValueError(
            f"RLZOO_OMP_WAIT_POLICY must be one of {', '.join(map(repr, WAIT_POLICIES))}, got {choice!r}"
        )
    wanted = WAIT_POLICIES[choice]
    if not wanted or "OMP_WAIT_POLICY" in env or "GOMP_SPINCOUNT" in env:
        return None
    if environ is None and "torch" in sys.modules:
        return None  # too late: libgomp has read its environment already
    env.update(wanted)
    return dict(wanted)
