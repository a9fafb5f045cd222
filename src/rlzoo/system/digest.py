"""A file's fingerprint that costs the same whatever its size: what a run records of the files it
depends on (a LoRA run's base model) or wrote (an export), to notice later that they changed."""

from __future__ import annotations

import hashlib
from pathlib import Path

#: a large file is fingerprinted by its size and this many evenly spaced chunks of its bytes
SAMPLES, CHUNK = 16, 1 << 16


def file_digest(path: str | Path) -> str:
    """sha256 of the file's size and bytes: all of them for a file up to 1 MiB (a config, a
    tokenizer file, a note), else :data:`SAMPLES` evenly spaced chunks of :data:`CHUNK` bytes.

    About 1 MiB is read whatever the size, and no mtime is used (a copy or ``touch`` changes it
    without changing the file). Any edit of a small file is seen; in a large weights file a change
    of every tensor (another model, a fine-tune written in place) is, an edit of a few bytes between
    two samples is not.
    """
    path = Path(path)
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as fh:
        if size <= SAMPLES * CHUNK:
            h.update(fh.read())
        else:
            for i in range(SAMPLES):
                fh.seek((size - CHUNK) * i // (SAMPLES - 1))
                h.update(fh.read(CHUNK))
    return h.hexdigest()
