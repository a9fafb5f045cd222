"""rlzoo.threads: waiting OpenMP threads sleep unless the user chose otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

from rlzoo.threads import choose_wait_policy


def test_passive_unless_the_user_chose():
    env: dict[str, str] = {}
    assert choose_wait_policy(env) == "PASSIVE" and env == {"OMP_WAIT_POLICY": "PASSIVE"}
    for given in (
        {"OMP_WAIT_POLICY": "ACTIVE"},
        {"GOMP_SPINCOUNT": "10000"},
        {"RLZOO_OMP_WAIT_POLICY": "keep"},
    ):
        env = dict(given)
        assert choose_wait_policy(env) is None and env == given


def test_set_when_rlzoo_is_imported_before_torch():
    """In a fresh interpreter, importing rlzoo sets the policy and imports no torch."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.pop("RLZOO_OMP_WAIT_POLICY", None)
    code = "import os, sys, rlzoo; print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["PASSIVE", "False"]
    code = "import torch, os, rlzoo; print(os.environ.get('OMP_WAIT_POLICY'))"  # too late: left alone
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None"]
