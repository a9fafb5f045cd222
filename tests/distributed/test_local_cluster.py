"""A local Ray cluster that rlzoo starts itself: its workers run at the driver's priority."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.ray

SCRIPT = textwrap.dedent(
    """
    import os, ray
    from rlzoo.distributed.ray_placement import init_ray
    assert init_ray(None)
    @ray.remote(num_cpus=0)
    def niceness():
        return os.nice(0)
    print("NICE", ray.get(niceness.remote()), "ENV", os.environ.get("RAY_worker_niceness"))
    ray.shutdown()
    """
)


@pytest.mark.parametrize(("given", "want"), [(None, 0), ("7", 7)], ids=["default", "user-set"])
def test_workers_start_at_the_drivers_priority_unless_the_user_says(given: str | None, want: int) -> None:
    pytest.importorskip("ray")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    if given is not None:
        env["RAY_worker_niceness"] = given
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300, check=True
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("NICE"))
    # Ray's default is 15 (failed before: NICE 15); the driver's environment is left as it was
    assert line == f"NICE {want + os.nice(0)} ENV {given}"
