"""rlzoo.system.threads: how waiting OpenMP threads wait (RLZOO_OMP_WAIT_POLICY; default: a short spin)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlzoo.system.threads import choose_wait_policy


def test_passive_when_asked_unless_the_user_chose():
    env = {"RLZOO_OMP_WAIT_POLICY": "passive"}
    assert choose_wait_policy(env) == {"OMP_WAIT_POLICY": "PASSIVE"} and env["OMP_WAIT_POLICY"] == "PASSIVE"
    env = {"RLZOO_OMP_WAIT_POLICY": "short"}
    assert choose_wait_policy(env) == {"GOMP_SPINCOUNT": "1000"} and "OMP_WAIT_POLICY" not in env
    env = {}  # the default: a short spin
    assert choose_wait_policy(env) == {"GOMP_SPINCOUNT": "1000"} and env == {"GOMP_SPINCOUNT": "1000"}
    for given in (
        {"RLZOO_OMP_WAIT_POLICY": "keep"},
        {"RLZOO_OMP_WAIT_POLICY": "short", "GOMP_SPINCOUNT": "300000"},
        {"GOMP_SPINCOUNT": "300000"},  # the user's own spin count, under the default
        {"OMP_WAIT_POLICY": "ACTIVE"},
        {"RLZOO_OMP_WAIT_POLICY": "passive", "OMP_WAIT_POLICY": "ACTIVE"},
        {"RLZOO_OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "10000"},
    ):
        env = dict(given)
        assert choose_wait_policy(env) is None and env == given
    with pytest.raises(ValueError, match="one of 'keep', 'passive', 'short'"):
        choose_wait_policy({"RLZOO_OMP_WAIT_POLICY": "sleepy"})


def test_import_sets_nothing_and_a_run_sets_the_policy_before_torch():
    """``import rlzoo`` changes no environment; starting a run (``build_run``, the CLI) sets the asked
    policy, before torch is imported, and leaves it alone once torch is loaded."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["RLZOO_OMP_WAIT_POLICY"] = "passive"
    code = "import os, sys, rlzoo; print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "False"]
    start = "import os, sys, rlzoo; rlzoo.build_run('quickstart'); "
    code = start + "print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["PASSIVE", "False"]
    code = "import torch, os, rlzoo; rlzoo.build_run('quickstart'); print(os.environ.get('OMP_WAIT_POLICY'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None"]  # too late: left alone
    env.pop("RLZOO_OMP_WAIT_POLICY")  # the default
    code = start + "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1000", "None"]
