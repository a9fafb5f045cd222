"""A read-only or full disk is a message naming the folder and the setting, before anything is
written (issue 23, item 10). Real file systems: a read-only tmpfs and a full one, mounted for the
test (skipped where this user cannot mount)."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlzoo.system.storage import StorageError, check_writable, storage_message


def _mount(where: Path, options: str) -> None:
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "ro"
    _mount(where, "ro,size=1m")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


@pytest.fixture
def full(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "full"
    _mount(where, "size=256k")
    try:
        with (where / "filler.bin").open("wb", buffering=0) as fh:  # fill it to the last block
            try:
                while True:
                    fh.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def _refused(out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """``rlzoo train quickstart`` into ``out``: refused (exit 2) with a message, no traceback; the message."""
    from rlzoo.cli import main

    rc = main(["train", "quickstart", f"run.output_dir={out}", "run.progress=false"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    return err


def test_train_into_a_read_only_file_system_is_a_message(
    read_only: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: OSError [Errno 30] Read-only file system, a traceback from mkdir."""
    err = _refused(read_only / "run", capsys)
    assert f"run.output_dir: {read_only / 'run'} is on a read-only file system" in err
    assert "run.output_dir=DIR" in err


def test_train_onto_a_full_disk_is_refused_before_anything_is_written(
    full: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused(full / "run", capsys)
    assert f"run.output_dir: the disk holding {full} is full" in err
    assert sorted(p.name for p in full.iterdir()) == ["filler.bin"]  # nothing written


def test_prepare_onto_a_full_disk_is_refused(full: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rlzoo.cli import main

    assert main(["prepare", "quickstart", "--out", str(full / "q")]) == 2
    assert "--out: the disk holding" in capsys.readouterr().err
    assert not (full / "q").exists()


def test_a_write_the_disk_refuses_mid_run_is_a_message() -> None:
    # /dev/full: every write fails with ENOSPC, as a disk that fills up during a run
    with pytest.raises(OSError) as e, open("/dev/full", "wb") as fh:
        fh.write(b"x")
        fh.flush()
    assert storage_message(e.value) == (
        "cannot write: No space left on device; free some space or choose a writable folder (run.output_dir=DIR)"
    )
    assert storage_message(OSError(errno.EINVAL, "Invalid argument")) is None  # not the disk's doing


def test_a_file_in_the_way_is_named(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(StorageError, match=r"afile is a file"):
        check_writable(tmp_path / "afile" / "run", "run.output_dir")


def test_a_safetensors_write_the_disk_refuses_is_a_message() -> None:
    """safetensors raises its own SafetensorError (not an OSError) on a full disk; the OS error it
    names makes it the same one-line message (the run-level test: tests/train/test_faults.py)."""
    from safetensors import SafetensorError

    full = SafetensorError(
        'Error while serializing: I/O error: No space left on device (os error 28) at path "/x/.tmpAb12"'
    )
    assert storage_message(full) == (
        "cannot write /x/.tmpAb12: No space left on device; free some space or choose a writable "
        "folder (run.output_dir=DIR)"
    )
    assert storage_message(SafetensorError("Error while deserializing header: HeaderTooLarge")) is None
    assert storage_message(ValueError("No space left on device (os error 28)")) is None
