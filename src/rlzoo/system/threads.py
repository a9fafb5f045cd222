"""How rlzoo's CPU thread pools wait: a short spin, then sleep (``RLZOO_OMP_WAIT_POLICY``).

torch's CPU kernels run on an OpenMP pool (GNU libgomp in the PyPI wheels). By default a libgomp
thread that reaches a barrier first spins -- 300,000 times, milliseconds -- before it sleeps; when
another process holds one of the cores, the partner it waits for is descheduled and the spinning
thread burns the CPU that partner needs, at every one of the hundreds of kernels of a forward.
On the shared 2-core machine (load average 5-6 from other work) the sync quickstart took 13.4 s for
15 steps with libgomp's waiting and 3.9 s with a spin of 1,000 (``benchmarks/busy.py``,
docs/performance.md); with one more core taken by a busy loop, 67.1 s against 5.5 s.

libgomp reads its environment once, when torch is imported, so :func:`choose_wait_policy` runs when
a run starts (``rlzoo.build_run``, which ``rlzoo train`` calls, before torch is imported; importing
``rlzoo`` sets nothing). ``RLZOO_OMP_WAIT_POLICY``:

- ``short`` (the default): ``GOMP_SPINCOUNT=1000`` -- spin about as long as the gap between two
  kernels (tens of microseconds), then sleep, so a quiet machine keeps most of the spin's benefit
  and a busy one loses little to it;
- ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` (sleep at once; every kernel then wakes its threads);
- ``keep``: libgomp's own waiting (nothing set).

Nothing is set when the user set ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``. A program that imported
torch before it built a run keeps torch's waiting (set the variables yourself). The
thread count stays torch's default (``OMP_NUM_THREADS`` / ``torch.set_num_threads`` change it).
"""

from __future__ import annotations

import os
import sys

__all__ = ["DEFAULT_WAIT_POLICY", "WAIT_POLICIES", "choose_wait_policy"]

# RLZOO_OMP_WAIT_POLICY -> the libgomp variables it sets (docs/performance.md, benchmarks/busy.py)
WAIT_POLICIES: dict[str, dict[str, str]] = {
    "keep": {},  # libgomp's own: spin 300,000 times in a barrier, then sleep
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},  # sleep at once
    "short": {"GOMP_SPINCOUNT": "1000"},  # spin briefly, then sleep
}
DEFAULT_WAIT_POLICY = "short"


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
