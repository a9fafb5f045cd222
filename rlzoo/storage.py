"""Can rlzoo write where it is asked to? Checked before anything is written, so a read-only or full
disk is a message naming the folder and the setting to change, not a traceback halfway through."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from rlzoo.errors import RlzooError

#: A disk with less free space than this is full for a run: its records (config, metrics) and one
#: checkpoint of even the quickstart's tiny model need more.
MIN_FREE_BYTES = 64 * 2**20

#: OS errors that mean "this place cannot be written" (not a bug of rlzoo's)
STORAGE_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT})


class StorageError(RlzooError):
    """A folder rlzoo must write into is read-only, not writable by this user, or on a full disk."""


def check_writable(path: Path, key: str, min_free: int = MIN_FREE_BYTES) -> None:
    """Raise :class:`StorageError` unless ``path`` (which may not exist yet) can be created and
    written, with at least ``min_free`` bytes free on its disk. ``key``: the setting that chose it."""
    path = Path(path).expanduser()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise StorageError(f"{key}: {path} cannot be created: {probe} is a file; choose a folder: {key}=DIR")
    st = os.statvfs(probe)
    if st.f_flag & os.ST_RDONLY:
        raise StorageError(
            f"{key}: {path} is on a read-only file system ({probe}); choose a writable folder: {key}=DIR"
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise StorageError(f"{key}: this user cannot write into {probe}; choose a writable folder: {key}=DIR")
    free = st.f_bavail * st.f_frsize
    if free < min_free:
        raise StorageError(
            f"{key}: the disk holding {probe} is full ({free / 2**20:.1f} MiB free; a run needs at least "
            f"{min_free / 2**20:.0f} MiB): free some space, or choose another folder: {key}=DIR"
        )


def storage_message(exc: OSError) -> str | None:
    """A one-line message for an OS error that means the disk refused a write (read-only, full,
    permission); None for any other error."""
    if exc.errno not in STORAGE_ERRNOS:
        return None
    where = f" {exc.filename}" if exc.filename else ""
    return f"cannot write{where}: {exc.strerror or exc}; free some space or choose a writable folder (run.output_dir=DIR)"
