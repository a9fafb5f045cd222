"""The console, ``metrics.jsonl`` and TensorBoard loggers (see :mod:`rlzoo.loggers`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlzoo.report.metrics import CONSOLE_KEYS, LoggerContext, set_aside_cut_row

logger = logging.getLogger("rlzoo")


class ConsoleLogger:
    """Progress bar (tqdm) with the key metrics; log lines when ``run.progress=false``."""

    def __init__(self, params: Any, context: LoggerContext) -> None:
        self._bar: Any = None
        if context.progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=context.total_steps,
                initial=context.initial_step,
                desc=context.desc,
                dynamic_ncols=True,
                unit="step",
            )

    def log(self, step: int, record: Mapping[str, Any], *, advance: bool = True) -> None:
        shown = {short: record[k] for k, short in CONSOLE_KEYS if isinstance(record.get(k), float)}
        text = " ".join(f"{s}={v:.3g}" for s, v in shown.items())
        if self._bar is None:
            logger.info("step %d %s", step, text)
            return
        self._bar.set_postfix_str(text, refresh=False)
        if advance:
            self._bar.update(1)
        else:
            self._bar.refresh()

    def write(self, message: str) -> None:
        """Print a line without breaking the progress bar."""
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class JsonlLogger:
    """Appends each record as one JSON line to ``RUN_DIR/metrics.jsonl``.

    A last line that a kill cut short (no newline) is moved to ``metrics.cut.<n>.jsonl`` before
    the first append, so the next row starts on its own line instead of joining it.
    """

    def __init__(self, params: Any, context: LoggerContext) -> None:
        self._file = None
        self._path: Path | None = None
        if context.run_dir is not None:
            path = self._path = context.run_dir / "metrics.jsonl"
            set_aside_cut_row(path)
            self._file = path.open("a")

    def log(self, step: int, record: Mapping[str, Any], *, advance: bool = True) -> None:
        if self._file is not None:
            try:
                self._file.write(json.dumps(dict(record)) + "\n")  # one write, then flushed whole
                self._file.flush()
            except OSError as exc:  # a write error names no file: say which (the disk full, ...)
                raise OSError(exc.errno, exc.strerror, str(self._path)) from exc

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TensorBoardLogger:
    """The float metrics as TensorBoard scalars in ``RUN_DIR/tensorboard``."""

    def __init__(self, params: Any, context: LoggerContext) -> None:
        self._tb: Any = None
        if context.run_dir is None:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: a resumed run drops the events it is about to write again
            self._tb = SummaryWriter(
                log_dir=str(context.run_dir / "tensorboard"), purge_step=context.purge_step
            )
        except Exception as exc:  # tensorboard missing: keep going with the other loggers
            logger.warning("TensorBoard logging disabled: %s", exc)

    def log(self, step: int, record: Mapping[str, Any], *, advance: bool = True) -> None:
        if self._tb is None:
            return
        for k, v in record.items():
            if k not in ("step", "time") and isinstance(v, float):
                self._tb.add_scalar(k, v, global_step=step)
        self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
