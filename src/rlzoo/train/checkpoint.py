"""The run directory's durable state: checkpoints, the one-writer lock, metrics on resume, the summary.

Checkpoints (``run_dir/checkpoints/step_<k>/``) are written crash-safe:

1. the train backend writes ``step_<k>.partial/`` (it may stage inside it as it likes);
2. the manager adds ``rlzoo_checkpoint.json``: the loop's payload plus the size and CRC-32 of every
   file (so a truncated or corrupted file is found and named before anything loads);
3. ``step_<k>.partial`` is renamed to ``step_<k>`` (atomic), then ``latest`` is updated.

A kill -9 at any moment leaves at worst a ``step_<k>.partial`` / ``.tmp`` / ``.old`` leftover,
which is never taken for a checkpoint and is removed at the next save; only ``step_<digits>``
directories with a manifest count. Anything else under ``checkpoints/`` (a user's ``step_5_best``
copy) is never touched. Pruning keeps the newest ``keep`` checkpoints and, with ``keep_best``, the
one with the best validation score. Loading verifies the manifest; a bad checkpoint is reported by
file name and the previous complete one is used (and said so).

A resume from step S starts a new branch (:meth:`CheckpointManager.branch_from`): the checkpoints
after S move to ``run_dir/checkpoints.after_step_S.N/`` (kept, not deleted), so ``latest`` is
always the newest checkpoint of the current branch. The move is recorded first
(``checkpoints/branch.json``) and completed by whoever reads the checkpoints next, so a kill -9
midway cannot leave a mix of the two branches.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import random
import re
import shutil
import time
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlzoo.kernel.errors import RlzooError
from rlzoo.report.metrics import set_aside_cut_row
from rlzoo.system.failpoints import failpoint
from rlzoo.system.storage import StorageError, disk_refusal

logger = logging.getLogger("rlzoo")

MANIFEST = "rlzoo_checkpoint.json"
STEP_DIR = re.compile(r"^step_(\d+)$")
#: what an interrupted write of ours leaves (``step_4.partial``, ``step_4.partial.tmp``, ``latest.tmp`` ...)
LEFTOVER = re.compile(r"^(step_\d+(\.partial|\.old|\.tmp)+|latest\.tmp)$")
BRANCH_FILE = "branch.json"
LOCK_FILE = ".rlzoo.lock"


class CheckpointError(RlzooError):
    """No usable checkpoint (missing, incomplete, truncated or corrupt)."""


class CheckpointWriteError(StorageError):
    """The disk refused a checkpoint's files (full, read-only); the previous checkpoint is intact."""


class BaseModelChanged(RlzooError):
    """A LoRA checkpoint's base model (``model.path``) is no longer the one it was trained on."""


class RunDirLocked(RlzooError):
    """Another process writes into this run directory."""


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------
def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def _files(root: Path) -> dict[str, list[int]]:
    return {
        str(f.relative_to(root)): [f.stat().st_size, _crc32(f)]
        for f in sorted(root.rglob("*"))
        if f.is_file() and f.name != MANIFEST
    }


def _fsync_tree(root: Path) -> None:
    for f in root.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


class CheckpointManager:
    """``run_dir/checkpoints/step_<k>/``; keeps the newest ``keep`` complete ones."""

    def __init__(
        self,
        run_dir: Path,
        keep: int = 2,
        *,
        keep_best: bool = False,
        base_model: Mapping[str, Any] | None = None,
    ) -> None:
        """``base_model``: the fingerprint of the model a LoRA run's adapters sit on
        (:func:`rlzoo.train_kit.lora.base_model_fingerprint`), recorded in every manifest and checked
        before a checkpoint that recorded one loads (:class:`BaseModelChanged`)."""
        self.run_dir = Path(run_dir)
        self.keep = keep
        self.keep_best = keep_best
        self.base_model = dict(base_model) if base_model is not None else None
        self.saved: list[Path] = []

    @property
    def root(self) -> Path:
        return self.run_dir / "checkpoints"

    # -- writing ---------------------------------------------------------------------------------
    def save(self, step: int, backend: Any, payload: Mapping[str, Any]) -> Path:
        """Write the checkpoint of ``step`` (see the module docstring); returns its directory.

        A disk that refuses the write (full, read-only) raises :class:`CheckpointWriteError`, a
        one-line message; the half-written checkpoint is removed and the previous one stays usable.
        """
        try:
            return self._save(step, backend, payload)
        except Exception as exc:
            refused = disk_refusal(exc)
            if refused is None:
                raise
            for ours in (f"step_{step}.partial", f"step_{step}.partial.tmp"):  # half-written by us
                shutil.rmtree(self.root / ours, ignore_errors=True)
            latest = self.latest()
            kept = (
                f"the previous checkpoint {latest} is intact" if latest else "there is no earlier checkpoint"
            )
            raise CheckpointWriteError(
                f"could not write the checkpoint of step {step} into {self.root}: {os.strerror(refused[0])}; "
                f"{kept}. Free some space (or move {self.run_dir} to a larger disk), then resume: "
                f"rlzoo train resume=latest run.output_dir={self.run_dir}"
            ) from exc

    def _save(self, step: int, backend: Any, payload: Mapping[str, Any]) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        self.clean_leftovers()
        final = self.root / f"step_{step}"
        staging = self.root / f"step_{step}.partial"
        failpoint("save:begin")
        state = dict(payload)
        state["python_random"] = _encode_random_state()
        backend.save_checkpoint(staging, state)
        staging.mkdir(parents=True, exist_ok=True)
        failpoint("save:staged")
        manifest = {"step": int(step), "payload": state, "files": _files(staging), "time": time.time()}
        if self.base_model is not None:
            manifest["base_model"] = self.base_model
        (staging / MANIFEST).write_text(json.dumps(manifest))
        _fsync_tree(staging)
        failpoint("save:manifest")
        if final.exists():  # a re-run of the same step (after a resume): the newer one wins
            old = self.root / f"step_{step}.old"
            final.rename(old)
            staging.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(final)
        failpoint("save:committed")
        tmp = self.root / "latest.tmp"
        tmp.write_text(final.name)
        tmp.replace(self.root / "latest")
        self.saved.append(final)
        self.prune(keep_path=final)
        return final

    def clean_leftovers(self) -> list[Path]:
        """Remove what interrupted writes of ours left behind (:data:`LEFTOVER` names only)."""
        removed: list[Path] = []
        if not self.root.is_dir():
            return removed
        for p in self.root.iterdir():
            if not LEFTOVER.match(p.name):
                continue
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
        if removed:
            logger.info("removed leftovers of interrupted checkpoint writes: %s", [p.name for p in removed])
        return removed

    def prune(self, keep_path: Path | None = None) -> None:
        """Delete the older checkpoints: all but the newest ``keep`` (and, with ``keep_best``, the
        best-validated one)."""
        steps = self.steps()
        best = self.best_step() if self.keep_best else None
        for k in steps[: max(0, len(steps) - max(1, self.keep))]:
            old = self.root / f"step_{k}"
            if old != keep_path and k != best:
                shutil.rmtree(old, ignore_errors=True)

    def best_step(self) -> int | None:
        """The step whose checkpoint recorded the highest validation score (``val``); None: none did."""
        best: tuple[float, int] | None = None
        for k in self.steps():
            try:
                manifest = json.loads((self.root / f"step_{k}" / MANIFEST).read_text())
            except (OSError, ValueError):
                continue
            val = (manifest.get("payload") or {}).get("val")
            if isinstance(val, (int, float)) and (best is None or float(val) > best[0]):
                best = (float(val), k)
        return None if best is None else best[1]

    # -- branches --------------------------------------------------------------------------------
    def branch_from(self, step: int) -> Path | None:
        """A resume from ``step``: move the checkpoints after it aside; returns where (None: none)."""
        later = [k for k in self.steps() if k > step]
        if not later:
            return None
        n = 1
        while (dest := self.run_dir / f"checkpoints.after_step_{step}.{n}").exists():
            n += 1
        record = {"from_step": int(step), "to": dest.name, "steps": later}
        tmp = self.root / (BRANCH_FILE + ".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(self.root / BRANCH_FILE)  # from here on the move is decided
        self._finish_branch()
        return dest

    def _finish_branch(self) -> None:
        """Complete a recorded branch move (idempotent: after a kill -9 midway, the rest moves)."""
        record_file = self.root / BRANCH_FILE
        if not record_file.is_file():
            return
        record = json.loads(record_file.read_text())
        dest = self.run_dir / record["to"]
        dest.mkdir(exist_ok=True)
        for k in record["steps"]:
            src = self.root / f"step_{k}"
            if src.is_dir():
                src.rename(dest / src.name)
        tmp = self.root / "latest.tmp"
        tmp.write_text(f"step_{record['from_step']}")
        tmp.replace(self.root / "latest")
        record_file.unlink()

    # -- reading ---------------------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Steps of the ``step_<k>`` directories of the current branch, ascending (complete or not)."""
        if not self.root.is_dir():
            return []
        self._finish_branch()
        return sorted(
            int(m.group(1)) for p in self.root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()
        )

    def latest(self) -> Path | None:
        """The newest checkpoint directory that has a manifest (not verified)."""
        for k in reversed(self.steps()):
            path = self.root / f"step_{k}"
            if (path / MANIFEST).is_file():
                return path
        return None

    def verify(self, path: Path) -> dict[str, Any]:
        """The manifest of ``path``; raises :class:`CheckpointError` naming the first bad file."""
        man_file = path / MANIFEST
        if not man_file.is_file():
            raise CheckpointError(f"{path}: no {MANIFEST}: the checkpoint was not completely written")
        try:
            manifest = json.loads(man_file.read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{man_file}: unreadable checkpoint manifest ({exc})") from exc
        for rel, (size, crc) in manifest.get("files", {}).items():
            f = path / rel
            if not f.is_file():
                raise CheckpointError(f"{f}: missing from the checkpoint")
            actual = f.stat().st_size
            if actual != size:
                raise CheckpointError(
                    f"{f}: truncated or altered ({actual} bytes, the checkpoint wrote {size})"
                )
            if _crc32(f) != crc:
                raise CheckpointError(f"{f}: corrupt (its checksum differs from the one written)")
        return dict(manifest)

    def load(self, backend: Any, step: int | None = None) -> dict[str, Any] | None:
        """Restore the newest good checkpoint (or exactly ``step``); returns its payload.

        A bad newer checkpoint is reported by file name and the previous complete one is used.
        None when there is no checkpoint at all.
        """
        if step is not None:
            path = self.root / f"step_{step}"
            if not path.is_dir():
                raise CheckpointError(
                    f"resume={step}: no checkpoint {path}; available steps: {self.steps() or 'none'}"
                )
            return self._load(path, backend)
        candidates = [self.root / f"step_{k}" for k in reversed(self.steps())]
        if not candidates:
            return None
        problems: list[str] = []
        for path in candidates:
            try:
                state = self._load(path, backend)
            except CheckpointError as exc:
                problems.append(str(exc))
                logger.warning("skipping checkpoint %s: %s", path.name, exc)
                print(f"rlzoo: checkpoint {path.name} is unusable: {exc}", flush=True)
                continue
            if problems:
                print(f"rlzoo: using the previous complete checkpoint {path.name} instead", flush=True)
            return state
        raise CheckpointError(
            "no usable checkpoint under " + str(self.root) + ":\n  " + "\n  ".join(problems)
        )

    def _check_base_model(self, path: Path, manifest: Mapping[str, Any]) -> None:
        """Refuse a checkpoint whose recorded base model differs from this run's (a LoRA adapter
        means nothing on another base); a checkpoint that recorded none is not checked."""
        saved = manifest.get("base_model")
        if not isinstance(saved, Mapping) or self.base_model is None:
            return
        old, new = dict(saved.get("files") or {}), dict(self.base_model.get("files") or {})
        changed = sorted(n for n in set(old) | set(new) if old.get(n) != new.get(n))
        if not changed:
            return
        what = ", ".join(
            f"{n} ({'new' if n not in old else 'removed' if n not in new else 'changed'})" for n in changed
        )
        raise BaseModelChanged(
            f"cannot resume from {path}: its LoRA adapter was trained on the base model at "
            f"{saved.get('path')}, and the model at model.path={self.base_model.get('path')} is not that "
            f"model any more: {what}. A LoRA checkpoint holds the adapter only; put the original base "
            "model back at model.path (or point model.path at it), or start a new run"
        )

    def _load(self, path: Path, backend: Any) -> dict[str, Any]:
        manifest = self.verify(path)
        self._check_base_model(path, manifest)
        try:
            backend.load_checkpoint(path)
        except Exception as exc:
            raise CheckpointError(f"{path}: the train backend could not load it: {exc}") from exc
        state = dict(manifest["payload"])
        if "python_random" in state:
            _decode_random_state(state.pop("python_random"))
        state.setdefault("step", int(STEP_DIR.match(path.name).group(1)))  # type: ignore[union-attr]
        state["path"] = str(path)
        return state


def _encode_random_state() -> Any:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _decode_random_state(state: Any) -> None:
    version, internal, gauss = state
    random.setstate((version, tuple(internal), gauss))


# ---------------------------------------------------------------------------------------------
# One writer per run directory
# ---------------------------------------------------------------------------------------------
class RunLock:
    """An exclusive ``fcntl.flock`` on ``run_dir/.rlzoo.lock`` holding the writer's PID.

    The OS releases it when the process exits, however it exits (kill -9 included).
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirLocked(
                f"run directory {self.path.parent} is in use by another rlzoo run (PID {holder}); "
                "wait for it to finish, stop it, or choose another run.output_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None


# ---------------------------------------------------------------------------------------------
# Metrics on resume, the summary
# ---------------------------------------------------------------------------------------------
def rewind_metrics(run_dir: Path, step: int) -> Path | None:
    """Move the ``metrics.jsonl`` rows past ``step`` to a side file; returns it (None: nothing to move).

    A resumed run re-runs the steps after its checkpoint; their old rows go to
    ``metrics.after_step_<step>.<n>.jsonl`` (kept, not deleted) so ``metrics.jsonl`` has one row per step.
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return None
    set_aside_cut_row(path)  # a row a kill cut short is not a row to keep or move
    keep: list[str] = []
    moved: list[str] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row_step = int(json.loads(line).get("step", 0))
        except (ValueError, AttributeError):
            keep.append(line)  # not ours to judge
            continue
        (moved if row_step > step else keep).append(line)
    if not moved:
        return None
    n = 1
    while (side := path.with_name(f"metrics.after_step_{step}.{n}.jsonl")).exists():
        n += 1
    side.write_text("\n".join(moved) + "\n")
    tmp = path.with_name("metrics.jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    tmp.replace(path)
    return side


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``summary.json``, or None when it has none (or an unreadable one)."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def write_summary(run_dir: Path, summary: Mapping[str, Any]) -> None:
    tmp = Path(run_dir) / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=str))
    tmp.replace(Path(run_dir) / "summary.json")
