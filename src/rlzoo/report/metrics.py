"""One metrics module for every runner: the records, and the loggers they go to.

The loggers are parts of kind ``logger`` (``run.loggers=[console,jsonl,tensorboard,wandb,mlflow]``;
the built-ins are in :mod:`rlzoo.loggers`, third parties add theirs with ``rlzoo_register_loggers``).

Metric names follow verl's where users know them (``critic/score/mean``, ``response_length/mean``,
``actor/pg_clipfrac``, ``timing_s/gen``, ``perf/throughput`` ...). Each ``log(step, metrics)`` call
appends exactly one JSON object (with ``step`` and wall-clock ``time``) to ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rlzoo.kernel.errors import RlzooError

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


@dataclass(frozen=True)
class LoggerContext:
    """What a logger factory receives besides its own params (kind ``logger``)."""

    run_dir: Path | None
    #: the run's name (``run.name``, e.g. the recipe's): W&B project / MLflow experiment default
    run_name: str = "rlzoo"
    #: this run's own name, stable across resumes: the run directory's name (tracker run name)
    run_id: str = "rlzoo"
    #: the resolved config (``RUN_DIR/config.yaml``) as plain data
    config: Mapping[str, Any] = field(default_factory=dict)
    #: plugin name -> version of every loaded plugin, and library versions (``plugins.json``)
    versions: Mapping[str, str] = field(default_factory=dict)
    #: the run continues from a checkpoint: continue the tracker's run too
    resumed: bool = False
    #: the first step this process logs is ``initial_step + 1``
    initial_step: int = 0
    total_steps: int | None = None
    progress: bool = True
    desc: str = "training"
    #: TensorBoard: drop events from this step on (a resumed run writes them again)
    purge_step: int | None = None
    #: the first step an earlier process of this run already logged and this one logs again (a
    #: resume from an earlier checkpoint; known from metrics.jsonl); None: nothing is redone. A
    #: tracker that keeps every point rewinds or branches here, so no step appears twice
    redone_from: int | None = None


@runtime_checkable
class MetricSink(Protocol):
    """A logger built by a ``logger`` factory: receives every step's record, then ``close()``."""

    def log(self, step: int, record: Mapping[str, Any], *, advance: bool = True) -> None:
        """``record``: ``step``, ``time`` and the step's metrics (floats; None for non-finite
        values; strings / lists kept). ``advance`` is False for a record that is not a training
        step (validation before training)."""
        ...

    def close(self) -> None: ...


def tracker_state(
    run_dir: Path | None, tracker: str, update: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What ``tracker`` keeps in ``RUN_DIR/trackers.json`` (its run id, to continue the same run on
    resume); with ``update``, merge it in and write the file first."""
    if run_dir is None:
        return dict(update or {})
    path = Path(run_dir) / "trackers.json"
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    if update:
        data[tracker] = {**data.get(tracker, {}), **update}
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        tmp.replace(path)
    return dict(data.get(tracker, {}))


def numeric_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """The float metrics of a record (``step``, ``time``, strings and nulls left out)."""
    return {
        k: v
        for k, v in record.items()
        if k not in ("step", "time") and isinstance(v, float) and math.isfinite(v)
    }


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists kept as values): a tracker's run params."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _run_record(run_dir: Path | None) -> tuple[dict[str, Any], dict[str, str]]:
    """The resolved config and the plugin / library versions the run in ``run_dir`` recorded there
    (``config.yaml``, ``plugins.json``; empty where it recorded none)."""
    config: dict[str, Any] = {}
    versions: dict[str, str] = {}
    if run_dir is not None:
        cfg_file = run_dir / "config.yaml"
        if cfg_file.exists():
            import yaml

            loaded = yaml.safe_load(cfg_file.read_text())
            config = loaded if isinstance(loaded, dict) else {}
        plugins_file = run_dir / "plugins.json"
        if plugins_file.exists():
            meta = json.loads(plugins_file.read_text())
            versions.update({str(k): str(v) for k, v in (meta.get("versions") or {}).items()})
            for p in meta.get("plugins") or []:
                if isinstance(p, Mapping) and p.get("status") == "loaded":
                    versions[str(p.get("name"))] = str(p.get("version") or "-")
    return config, versions


class MetricsLogger:
    """Sends every step's record to the run's loggers (``run.loggers``); keeps the history.

    ``loggers``: bound selections of kind ``logger`` (what :class:`~rlzoo.recipe.types.RecipeConfig`
    holds) or registered names. The context each logger gets is read from the run directory
    (``config.yaml``, ``plugins.json``), which the run writes before it starts.
    """

    def __init__(
        self,
        run_dir: Path | None,
        loggers: Iterable[Any] = ("console", "jsonl", "tensorboard"),
        *,
        total_steps: int | None = None,
        progress: bool = True,
        desc: str = "training",
        initial_step: int = 0,
        purge_step: int | None = None,
        redone_from: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else None
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        config, versions = _run_record(self.run_dir)
        run_name = str((config.get("run") or {}).get("name") or "rlzoo")
        self.context = LoggerContext(
            run_dir=self.run_dir,
            run_name=run_name,
            run_id=self.run_dir.name if self.run_dir is not None else run_name,
            config=config,
            versions=versions,
            resumed=purge_step is not None,
            initial_step=initial_step,
            total_steps=total_steps,
            progress=progress,
            desc=desc,
            purge_step=purge_step,
            redone_from=redone_from,
        )
        self.sinks: dict[str, MetricSink] = {}
        try:
            for sel in _selections(loggers):
                if sel.name in self.sinks:
                    continue
                self.sinks[sel.name] = sel.fn(sel.params, self.context)
        except BaseException:
            self.close()
            raise
        self.loggers = set(self.sinks)
        self.history: list[dict[str, Any]] = []

    def log(self, step: int, metrics: Mapping[str, Any], *, advance: bool = True) -> dict[str, Any]:
        """Send the record of ``step`` (:meth:`record`) to every logger; returns it."""
        return self.emit(self.record(step, metrics), advance=advance)

    @staticmethod
    def record(step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """The row ``log`` writes for ``step`` (``step``, ``time``, floats, None for non-finite
        values, strings / lists / dicts kept); plain JSON, so a checkpoint can carry it."""
        record: dict[str, Any] = {"step": int(step), "time": time.time()}
        for k, v in metrics.items():
            f = to_float(v)
            if f is None:
                if isinstance(v, (str, list, dict)):
                    record[k] = v
                continue
            record[k] = f if math.isfinite(f) else None
        return record

    def emit(self, record: Mapping[str, Any], *, advance: bool = True) -> dict[str, Any]:
        """Send a ready row (from :meth:`record`) to every logger."""
        row = dict(record)
        self.history.append(row)
        for sink in self.sinks.values():
            sink.log(int(row["step"]), row, advance=advance)
        return row

    def write(self, message: str) -> None:
        """Print a line without breaking the progress bar."""
        for sink in self.sinks.values():
            write = getattr(sink, "write", None)
            if callable(write):
                write(message)
                return
        print(message, flush=True)

    def close(self) -> None:
        for name, sink in list(getattr(self, "sinks", {}).items()):
            try:
                sink.close()
            except Exception as exc:  # one tracker failing to close must not hide the others
                logger.warning("closing logger %s failed: %s", name, exc)


def _selections(loggers: Iterable[Any]) -> list[Any]:
    """Bound logger selections; registered names are bound with their default params."""
    out = []
    names: list[str] = []
    for item in loggers:
        if isinstance(item, str):
            names.append(item)
        else:
            out.append(item)
    if names:
        from rlzoo.kernel.errors import ConfigError
        from rlzoo.kernel.plugins import get_plugin_manager
        from rlzoo.recipe.config import bind_part

        pm = get_plugin_manager()
        problems: list[str] = []
        for i, name in enumerate(names):
            sel = bind_part("logger", name, f"run.loggers[{i}]", problems, pm)
            if sel is not None:
                out.append(sel)
        if problems:
            raise ConfigError(problems)
    return out


class MetricsFileError(RlzooError):
    """A ``metrics.jsonl`` line that is not a JSON object (not a write cut short: one in the middle)."""


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl``.

    A last line without its newline that does not parse is a write cut short (a kill mid-row; the
    resumed run moves it aside, :func:`set_aside_cut_row`): it is skipped with a warning. Any other
    line that is not a JSON object is a :class:`MetricsFileError` naming the file and line.
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    records: list[dict[str, Any]] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if n == len(lines):  # no newline after it: the write was cut short
                logger.warning("%s: the last line (%d) was cut short and is skipped: %.60r", path, n, line)
                continue
            raise MetricsFileError(
                f"{path}: line {n} is not JSON ({exc.msg}, column {exc.colno}): {line[:80]!r}. Every line "
                "rlzoo writes is one JSON object; remove or fix that line (a copy of the file keeps it)"
            ) from None
        if not isinstance(row, dict):
            raise MetricsFileError(
                f"{path}: line {n} is {type(row).__name__} {line[:80]!r}, not a JSON object"
            )
        records.append(row)
    return records


def missing_row(run_dir: Path, row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``row`` (the metrics row a checkpoint carries) when ``RUN_DIR/metrics.jsonl`` has no row of
    its step: the process was killed between saving that checkpoint and writing the row. None when
    the row is there, or when there is nothing to compare (no row carried, no metrics.jsonl)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not row or "step" not in row or not path.is_file():
        return None
    try:
        steps = {r.get("step") for r in read_metrics(Path(run_dir))}
    except MetricsFileError:
        return None
    return None if int(row["step"]) in steps else dict(row)


def set_aside_cut_row(path: Path) -> Path | None:
    """Move a last line left without its newline (a kill mid-write) from the file at ``path`` to a
    side file ``<stem>.cut.<n><suffix>`` beside it (kept, not deleted), so that the next appended row
    starts on its own line instead of joining it. Returns the side file (None: the file was whole)."""
    path = Path(path)
    if not path.is_file():
        return None
    with path.open("rb") as fh:
        data = fh.read()
    if not data or data.endswith(b"\n"):
        return None
    cut = data.rfind(b"\n") + 1  # 0 when the whole file is one cut line
    n = 1
    while (side := path.with_name(f"{path.stem}.cut.{n}{path.suffix}")).exists():
        n += 1
    side.write_bytes(data[cut:] + b"\n")
    with path.open("r+b") as fh:
        fh.truncate(cut)
        fh.flush()
        os.fsync(fh.fileno())
    logger.warning("%s: its last line was cut short (a kill mid-write); moved to %s", path, side.name)
    return side
