"""One metrics module for every runner: TensorBoard + ``metrics.jsonl`` + console.

Metric names follow verl's where users know them (``critic/score/mean``, ``response_length/mean``,
``actor/pg_clipfrac``, ``timing_s/gen``, ``perf/throughput`` ...). Each ``log(step, metrics)`` call
appends exactly one JSON object (with ``step`` and wall-clock ``time``) to ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

logger = logging.getLogger("rlzoo")

#: what the console line / progress bar shows, in order, when present
CONSOLE_KEYS: tuple[tuple[str, str], ...] = (
    ("critic/score/mean", "reward"),
    ("val/mean", "val"),
    ("response_length/mean", "len"),
    ("actor/pg_clipfrac", "clip"),
    ("actor/kl_loss", "kl"),
    ("actor/entropy", "ent"),
    ("actor/grad_norm", "gnorm"),
    ("timing_s/step", "step_s"),
    ("perf/throughput", "tok/s"),
    ("trainer/idle_ratio", "idle"),
    ("queue/size", "queue"),
)


def to_float(v: Any) -> float | None:
    """A metric value as a float (tensors and numpy scalars included); None if not numeric."""
    if hasattr(v, "item") and callable(v.item):
        try:
            v = v.item()
        except Exception:
            return None
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    return None


def mean_metrics(dicts: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Mean of each key over the dicts that have it."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for d in dicts:
        for k, v in d.items():
            f = to_float(v)
            if f is None:
                continue
            sums[k] += f
            counts[k] += 1
    return {k: sums[k] / counts[k] for k in sums}


class PhaseTimer:
    """Accumulates wall-clock seconds per phase: ``with timer("gen"): ...`` -> ``timing_s/gen``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{k}": v for k, v in self.seconds.items()}

    def reset(self) -> None:
        self.seconds.clear()


class MetricsLogger:
    """Writes metrics to the run directory; shows a live progress line."""

    def __init__(
        self,
        run_dir: Path | None,
        loggers: Iterable[str] = ("console", "jsonl", "tensorboard"),
        *,
        total_steps: int | None = None,
        progress: bool = True,
        desc: str = "training",
        initial_step: int = 0,
        purge_step: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.loggers = set(loggers)
        unknown = self.loggers - {"console", "jsonl", "tensorboard"}
        if unknown:
            raise ValueError(f"unknown loggers {sorted(unknown)}; choose from console, jsonl, tensorboard")
        self._jsonl = None
        self._tb: Any = None
        if self.run_dir is not None and "jsonl" in self.loggers:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._jsonl = (self.run_dir / "metrics.jsonl").open("a", buffering=1)
        if self.run_dir is not None and "tensorboard" in self.loggers:
            try:
                from torch.utils.tensorboard import SummaryWriter

                # purge_step: a resumed run drops the events it is about to write again
                self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"), purge_step=purge_step)
            except Exception as exc:  # tensorboard missing: keep going with the other sinks
                logger.warning("TensorBoard logging disabled: %s", exc)
        self._bar: Any = None
        if progress and "console" in self.loggers:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total_steps, initial=initial_step, desc=desc, dynamic_ncols=True, unit="step"
            )
        self.history: list[dict[str, Any]] = []

    def log(self, step: int, metrics: Mapping[str, Any], *, advance: bool = True) -> dict[str, Any]:
        record: dict[str, Any] = {"step": int(step), "time": time.time()}
        for k, v in metrics.items():
            f = to_float(v)
            if f is None:
                if isinstance(v, (str, list, dict)):
                    record[k] = v
                continue
            record[k] = f if math.isfinite(f) else None
        self.history.append(record)
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for k, v in record.items():
                if k not in ("step", "time") and isinstance(v, float):
                    self._tb.add_scalar(k, v, global_step=step)
            self._tb.flush()
        if "console" in self.loggers:
            shown = {short: record[k] for k, short in CONSOLE_KEYS if isinstance(record.get(k), float)}
            text = " ".join(f"{s}={v:.3g}" for s, v in shown.items())
            if self._bar is not None:
                self._bar.set_postfix_str(text, refresh=False)
                if advance:
                    self._bar.update(1)
                else:
                    self._bar.refresh()
            else:
                logger.info("step %d %s", step, text)
        return record

    def write(self, message: str) -> None:
        """Print a line without breaking the progress bar."""
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl``."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
