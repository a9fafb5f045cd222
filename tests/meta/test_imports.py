"""Listing parts stays light: no distributed runtime, no inference engine is imported."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch.distributed", "ray", "vllm", "megatron")

PROBE = """
import contextlib, io, json, sys
from rlzoo.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    for args in (["components", "--json"], ["plugins", "--all", "--json"], ["components"]):
        assert main(args) == 0, args
print(json.dumps(sorted(sys.modules)))
"""


def _modules_after_listing() -> set[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.splitlines()[-1]))


def test_listing_components_imports_no_heavy_module() -> None:
    mods = _modules_after_listing()
    loaded = sorted(m for m in mods if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert not loaded, f"`rlzoo components` imported {loaded}; move these imports into the factories"
    # the example plugin's implementation module is registered lazily, as "module:attr"
    assert "rlzoo_example.advantage" not in mods
