"""What the machine offers a run: memory available now, and whether the CPU computes in bf16 natively.

Read from the OS (``/proc/meminfo``, ``/proc/cpuinfo`` on Linux; ``sysconf`` elsewhere), no torch:
the fastest-settings chooser (:mod:`rlzoo.train_kit.fastest`) decides micro-batch sizes and
precision from these two facts, and says which it used.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["BF16_FLAGS", "available_memory_bytes", "cpu_bf16_flags"]

#: /proc/cpuinfo flags of native bf16 arithmetic (AVX-512 BF16 dot products, AMX tiles)
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def available_memory_bytes(meminfo: str | None = None) -> int | None:
    """Memory a new allocation can get now: ``MemAvailable`` of ``/proc/meminfo`` (``meminfo``: its
    text, for tests), else free physical pages (``sysconf``); None when neither is known."""
    text = meminfo
    if text is None:
        try:
            text = Path("/proc/meminfo").read_text()
        except OSError:
            text = ""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            scale = (
                {"kb": 1024, "mb": 1024**2, "gb": 1024**3}.get(parts[2].lower(), 1) if len(parts) > 2 else 1
            )
            return int(parts[1]) * scale
    if meminfo is not None:
        return None
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def cpu_bf16_flags(cpuinfo: str | None = None) -> tuple[str, ...]:
    """The :data:`BF16_FLAGS` the CPU reports (``cpuinfo``: the text of ``/proc/cpuinfo``, for tests);
    empty when it has none or the OS does not say."""
    text = cpuinfo
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            return ()
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags") and ":" in line:
            flags.update(line.split(":", 1)[1].split())
    return tuple(f for f in BF16_FLAGS if f in flags)
