"""Can rlzoo write where it is asked to? Checked before anything is written, so a read-only or full
disk is a message naming the folder and the setting to change, not a traceback halfway through."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from rlzoo.kernel.errors import RlzooError

#: A disk with less free space than this is full for a run: its records (config, metrics) and one
#: checkpoint of even the quickstart's tiny model need more.
MIN_FREE_BYTES = 64 * 2**20

#: OS errors that mean "this place cannot be written" (not a bug of rlzoo's); EFBIG: a file larger
#: than the file system or the process's file-size limit allows
STORAGE_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
#: how safetensors' SafetensorError (a Rust ``io::Error``) names the OS error: "... (os error 28) at path "X""
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)(?: at path \"([^\"]*)\")?")


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


def disk_refusal(exc: BaseException) -> tuple[int, str | None] | None:
    """``(errno, file or None)`` when ``exc`` means the disk refused a write (read-only, full,
    permission, file too large); None for any other error.

    An :class:`OSError` carries its errno; safetensors' ``SafetensorError`` (what ``save_file`` and
    ``save_pretrained`` raise on a full disk) is not an OSError and names it in its text.
    """
    if isinstance(exc, OSError):
        code, where = exc.errno, exc.filename
    else:
        try:
            from safetensors import SafetensorError
        except ImportError:  # pragma: no cover - safetensors is a dependency
            return None
        if not isinstance(exc, SafetensorError) or not (m := _RUST_OS_ERROR.search(str(exc))):
            return None
        code, where = int(m.group(1)), m.group(2)
    if code not in STORAGE_ERRNOS:
        return None
    return code, (str(where) if where else None)


def storage_message(exc: BaseException) -> str | None:
    """A one-line message for an error that means the disk refused a write (read-only, full,
    permission); None for any other error."""
    refused = disk_refusal(exc)
    if refused is None:
        return None
    code, where = refused
    at = f" {where}" if where else ""
    return f"cannot write{at}: {os.strerror(code)}; free some space or choose a writable folder (run.output_dir=DIR)"
