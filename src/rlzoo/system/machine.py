"""What the machine offers a run: memory available now, and whether the CPU computes in bf16 natively;
and giving the C heap's freed memory back to it (:func:`release_freed_memory`).

Read from the OS (``/proc/meminfo``, ``/proc/cpuinfo`` on Linux; ``sysconf`` elsewhere), no torch:
the fastest-settings chooser (:mod:`rlzoo.train_kit.fastest`) decides micro-batch sizes and
precision from these two facts, and says which it used.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

__all__ = ["BF16_FLAGS", "available_memory_bytes", "cpu_bf16_flags", "release_freed_memory"]

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


@functools.cache
def _glibc() -> Any:
    """The C library when it is glibc (it has ``malloc_trim``), else None; loaded once."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def release_freed_memory() -> bool:
    """Give the memory the C heap holds but no longer uses back to the OS (glibc's ``malloc_trim(0)``);
    False where the C library is not glibc (nothing done).

    A CPU update allocates and frees gigabytes of tensors of varying sizes a step (padding-free
    micro-batches differ in length); glibc keeps what is freed for reuse in its arenas, and the
    process grew: a fully_async trainer worker on SmolLM2 (fp32, micro-batches of 8) rose from 3.2
    to 13.0 GB of anonymous memory in 5 steps, 3.5 GB after one ``malloc_trim(0)``, and at
    micro-batches of 16 Ray's memory monitor killed it (docs/performance.md). Called after every
    update on a CPU (:func:`rlzoo.train_kit.update.run_update`); it takes milliseconds.
    """
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
