"""The Weights & Biases and MLflow loggers (see :mod:`rlzoo.loggers`).

Each keeps its tracker run id in ``RUN_DIR/trackers.json`` when it starts a run, and a resumed
rlzoo run (``resume=true``) continues that tracker run instead of starting a new one. A resume
from an earlier checkpoint redoes steps the tracker already has: W&B rewinds its run to the first
redone step (``resume_from``); MLflow, which cannot delete logged points, continues in a new run
that holds the steps before it. No step appears twice in a tracker's history.
"""

from __future__ import annotations

import configparser
import logging
import netrc
import os
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from rlzoo.kernel.errors import RlzooError, import_optional
from rlzoo.report.metrics import LoggerContext, flatten, numeric_metrics, tracker_state

logger = logging.getLogger("rlzoo")


def _require(module: str, extra: str) -> Any:
    return import_optional(
        module, f"the {module} logger needs the package {module!r}: pip install rlzoo[{extra}]"
    )


def _saved_state(tracker: str, problem: str | None, context: LoggerContext) -> dict[str, Any]:
    """The tracker's state saved in the run directory (its run id, ...), once ``problem`` (what
    ``rlzoo validate`` refuses too, checked here for runs built without it) is None."""
    if problem:
        raise RlzooError(f"the {tracker} logger: {problem}")
    return tracker_state(context.run_dir, tracker)


def _wandb_mode(mode: str | None) -> str:
    """The mode W&B will run in: the param, else ``WANDB_MODE``, else the ``mode`` that
    ``wandb offline`` / ``wandb disabled`` wrote to W&B's settings file, else online."""
    if mode or os.environ.get("WANDB_MODE"):
        return str(mode or os.environ.get("WANDB_MODE"))
    config_dir = os.environ.get("WANDB_CONFIG_DIR") or str(Path("~/.config/wandb").expanduser())
    settings = configparser.ConfigParser()
    try:
        settings.read(Path(config_dir) / "settings")
        return settings.get("default", "mode", fallback="online")
    except configparser.Error:
        return "online"


def wandb_key_problem(mode: str | None) -> str | None:
    """Why W&B cannot log online here (no API key in ``WANDB_API_KEY``, ``WANDB_IDENTITY_TOKEN_FILE``
    or the ``.netrc`` entry ``wandb login`` writes), with what to set; None when it can or when it
    runs offline / disabled."""
    if _wandb_mode(mode) in ("offline", "dryrun", "disabled"):
        return None
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return None
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    path = Path(os.environ.get("NETRC") or Path("~/.netrc").expanduser())
    try:
        if path.is_file() and netrc.netrc(str(path)).authenticators(host):
            return None
    except (netrc.NetrcParseError, OSError):
        pass
    return (
        f"W&B logs online here and finds no API key for {host} (WANDB_API_KEY is not set, no {path} "
        "entry): export WANDB_API_KEY=<your key> (or run `wandb login`), or log offline with "
        "{name: wandb, mode: offline} or WANDB_MODE=offline and upload later with `wandb sync`"
    )


class WandbLogger:
    """One W&B run per rlzoo run: config + plugin versions at start, every step's metrics."""

    def __init__(self, params: Any, context: LoggerContext) -> None:
        wandb = _require("wandb", "wandb")
        state = _saved_state("wandb", wandb_key_problem(params.mode), context)
        run_id = state.get("id") if context.resumed else None
        resume: dict[str, Any] = {"id": run_id, "resume": "allow"}
        if run_id and context.redone_from is not None:
            # steps from redone_from on were logged by the branch this resume abandons: rewind the
            # run to the step before (W&B drops a step below its current one, keeping the old
            # branch's value; rewound to step K it keeps steps <= K and takes K + 1 next)
            resume = {"resume_from": f"{run_id}?_step={context.redone_from - 1}"}
        if not run_id:  # new: readable and unique (W&B ids allow letters, digits, - and _)
            resume["id"] = re.sub(r"[^\w-]", "-", context.run_id)[:50] + "-" + uuid.uuid4().hex[:8]
        try:
            self.run = wandb.init(
                project=params.project or context.run_name,
                entity=params.entity,
                group=params.group,
                tags=list(params.tags) or None,
                name=context.run_id,
                mode=params.mode,
                # WANDB_DIR wins; else the run directory holds the W&B files (RUN_DIR/wandb/)
                dir=os.environ.get("WANDB_DIR") or (str(context.run_dir) if context.run_dir else None),
                config={**dict(context.config), "rlzoo_versions": dict(context.versions)},
                **resume,
            )
        except wandb.errors.UsageError as exc:  # e.g. no API key found after all
            raise RlzooError(
                f"the wandb logger could not start a W&B run: {exc} (set WANDB_API_KEY, or log offline "
                "with WANDB_MODE=offline)"
            ) from None
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


def absolute_tracking_uri(uri: str) -> str:
    """``uri`` with a relative local path made absolute (against the working directory), so that
    the same store is found from any directory: ``sqlite:///mlflow.db`` -> ``sqlite:////cwd/mlflow.db``,
    ``mlruns`` or ``file:mlruns`` -> ``file:///cwd/mlruns``. Server URIs are returned as they are."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + os.path.abspath(uri[len("sqlite:///") :])
    parsed = urlparse(uri)
    if parsed.scheme == "" or (
        parsed.scheme == "file" and not parsed.netloc and not parsed.path.startswith("/")
    ):
        return Path(parsed.path or uri).resolve().as_uri()
    return uri


def _is_file_store(uri: str) -> bool:
    scheme = urlparse(uri).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and uri[1:3] in (":/", ":\\"))  # C:/ paths


def mlflow_store_problem(tracking_uri: str | None) -> str | None:
    """Why MLflow would refuse the tracking store at run start: MLflow 3 keeps the file store
    (``file:`` URIs, plain paths) in maintenance mode and raises unless ``MLFLOW_ALLOW_FILE_STORE``
    is true. None when the store is usable (or MLflow is not installed: binding says so)."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri or not _is_file_store(uri):
        return None
    try:
        from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE  # type: ignore[attr-defined]
    except ImportError:  # MLflow missing, or one that takes file stores without asking
        return None
    if MLFLOW_ALLOW_FILE_STORE.get():
        return None
    where = "tracking_uri" if tracking_uri else "MLFLOW_TRACKING_URI"
    return (
        f"{where} {uri!r} is an MLflow file store, which this MLflow refuses (maintenance mode) unless "
        "MLFLOW_ALLOW_FILE_STORE=true is set: use a database store, e.g. tracking_uri: "
        f"'sqlite:///{os.path.abspath('mlflow.db')}', or export MLFLOW_ALLOW_FILE_STORE=true"
    )


class MLflowLogger:
    """One MLflow run per rlzoo run: config as params, plugin versions as tags, step metrics."""

    #: MLflow caps a param value at 6000 characters (older servers: 500); longer ones are cut
    MAX_PARAM = 500

    def __init__(self, params: Any, context: LoggerContext) -> None:
        mlflow = _require("mlflow", "mlflow")
        from mlflow.tracking import MlflowClient

        state = _saved_state("mlflow", mlflow_store_problem(params.tracking_uri), context)
        run_id = state.get("run_id") if context.resumed else None
        uri = params.tracking_uri
        if run_id and state.get("tracking_uri") and uri in (None, state.get("tracking_uri_given")):
            uri = state["tracking_uri"]  # the store the run was created in, from any directory
        self.client = MlflowClient(tracking_uri=uri)
        if run_id:
            run_id = self._continue(run_id, context)
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
            self._log_params(run_id, items)
        self.run_id = run_id
        self._mlflow = mlflow
        tracker_state(
            context.run_dir,
            "mlflow",
            {
                "run_id": run_id,
                "tracking_uri": absolute_tracking_uri(self.client.tracking_uri),
                "tracking_uri_given": state.get("tracking_uri_given", params.tracking_uri)
                if context.resumed
                else params.tracking_uri,
            },
        )

    def _log_params(self, run_id: str, items: list[Any]) -> None:
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(run_id, params=items[i : i + 100])

    def _continue(self, run_id: str, context: LoggerContext) -> str:
        """Continue MLflow run ``run_id``; when it already holds steps this run redoes (a resume
        from an earlier checkpoint), continue in a new run with the steps before them instead."""
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException as exc:
            raise RlzooError(
                f"the mlflow logger: MLflow run {run_id} (recorded in {context.run_dir}/trackers.json) is "
                f"not in the tracking store {self.client.tracking_uri}: pass the store the run was "
                f"created in as tracking_uri ({exc.__class__.__name__}: {str(exc)[:200]})"
            ) from None
        first = context.purge_step
        history = (
            {key: self.client.get_metric_history(run_id, key) for key in run.data.metrics}
            if first is not None
            else {}
        )
        if not any(m.step >= first for points in history.values() for m in points):  # type: ignore[operator]
            self.client.update_run(run_id, status="RUNNING")
            return run_id
        from mlflow.entities import Metric, Param

        tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}
        tags.update({"rlzoo.continues": run_id, "rlzoo.resumed_at_step": str(first - 1)})  # type: ignore[operator]
        new_id = self.client.create_run(
            run.info.experiment_id, run_name=run.info.run_name, tags=tags
        ).info.run_id
        self._log_params(new_id, [Param(k, v) for k, v in run.data.params.items()])
        kept = [
            Metric(key, m.value, m.timestamp, m.step)
            for key, points in history.items()
            for m in points
            if m.step < first  # type: ignore[operator]
        ]
        for i in range(0, len(kept), 1000):
            self.client.log_batch(new_id, metrics=kept[i : i + 1000])
        self.client.set_tag(run_id, "rlzoo.superseded_by", new_id)
        self.client.set_terminated(run_id, status="KILLED")
        logger.warning(
            "mlflow: run %s already holds steps from %d on, which this resume redoes; MLflow cannot delete "
            "logged points, so the run continues as MLflow run %s (steps before %d copied; tagged "
            "rlzoo.continues / rlzoo.superseded_by)",
            run_id,
            first,
            new_id,
            first,
        )
        return new_id

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
