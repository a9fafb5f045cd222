"""The Weights & Biases and MLflow loggers (see :mod:`rlzoo.loggers`).

Each keeps its tracker run id in ``RUN_DIR/trackers.json`` when it starts a run, and a resumed
rlzoo run (``resume=true``) continues that tracker run instead of starting a new one.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping
from typing import Any

from rlzoo.errors import RlzooError
from rlzoo.metrics import LoggerContext, flatten, numeric_metrics, tracker_state


def _require(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise RlzooError(
            f"the {module} logger needs the package {module!r}: pip install rlzoo[{extra}]"
        ) from exc


class WandbLogger:
    """One W&B run per rlzoo run: config + plugin versions at start, every step's metrics."""

    def __init__(self, params: Any, context: LoggerContext) -> None:
        wandb = _require("wandb", "wandb")
        state = tracker_state(context.run_dir, "wandb")
        run_id = state.get("id") if context.resumed else None
        if not run_id:  # new: readable and unique (W&B ids allow letters, digits, - and _)
            run_id = re.sub(r"[^\w-]", "-", context.run_id)[:50] + "-" + uuid.uuid4().hex[:8]
        self.run = wandb.init(
            project=params.project or context.run_name,
            entity=params.entity,
            group=params.group,
            tags=list(params.tags) or None,
            name=context.run_id,
            id=run_id,
            resume="allow",
            mode=params.mode,
            # WANDB_DIR wins; else the run directory holds the W&B files (RUN_DIR/wandb/)
            dir=os.environ.get("WANDB_DIR") or (str(context.run_dir) if context.run_dir else None),
            config={**dict(context.config), "rlzoo_versions": dict(context.versions)},
        )
        tracker_state(context.run_dir, "wandb", {"id": self.run.id, "project": self.run.project})

    def log(self, step: int, record: Mapping[str, Any], *, advance: bool = True) -> None:
        metrics = numeric_metrics(record)
        if metrics:
            self.run.log(metrics, step=step)

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


#: characters MLflow accepts in metric and param names (anything else becomes "_")
_MLFLOW_NAME = re.compile(r"[^\w./\- :]")


def mlflow_name(key: str) -> str:
    """A metric name MLflow accepts: ``val/aime/mean@32`` -> ``val/aime/mean_at_32``."""
    return _MLFLOW_NAME.sub("_", key.replace("@", "_at_"))


class MLflowLogger:
    """One MLflow run per rlzoo run: config as params, plugin versions as tags, step metrics."""

    #: MLflow caps a param value at 6000 characters (older servers: 500); longer ones are cut
    MAX_PARAM = 500

    def __init__(self, params: Any, context: LoggerContext) -> None:
        mlflow = _require("mlflow", "mlflow")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=params.tracking_uri)
        state = tracker_state(context.run_dir, "mlflow")
        run_id = state.get("run_id") if context.resumed else None
        if run_id:
            self.client.update_run(run_id, status="RUNNING")
        else:
            name = params.experiment or context.run_name
            exp = self.client.get_experiment_by_name(name)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
            tags = {f"rlzoo.version.{k}": str(v) for k, v in context.versions.items()}
            run = self.client.create_run(exp_id, run_name=context.run_id, tags=tags)
            run_id = run.info.run_id
            from mlflow.entities import Param

            items = [
                Param(mlflow_name(k), str(v)[: self.MAX_PARAM]) for k, v in flatten(context.config).items()
            ]
            for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
                self.client.log_batch(run_id, params=items[i : i + 100])
        self.run_id = run_id
        self._mlflow = mlflow
        tracker_state(context.run_dir, "mlflow", {"run_id": run_id, "tracking_uri": self.client.tracking_uri})

    def log(self, step: int, record: Mapping[str, Any], *, advance: bool = True) -> None:
        from mlflow.entities import Metric

        metrics = numeric_metrics(record)
        if not metrics:
            return
        ts = int(float(record.get("time") or 0.0) * 1000)
        batch = [Metric(mlflow_name(k), v, ts, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):  # MLflow takes at most 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def close(self) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id)
            self.run_id = None
