"""Built-in loggers (kind ``logger``): where a run's metrics go, selected by ``run.loggers``.

``console`` (progress bar), ``jsonl`` (``RUN_DIR/metrics.jsonl``), ``tensorboard``
(``RUN_DIR/tensorboard``), and the trackers ``wandb`` (``pip install rlzoo[wandb]``) and ``mlflow``
(``pip install rlzoo[mlflow]``). They register through the same hook a third-party logger uses
(:func:`rlzoo.kernel.hookspecs.rlzoo_register_loggers`). Import-light: each logger's module (and its
package) is imported only when a run uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlzoo.kernel.hookspecs import hookimpl
from rlzoo.kernel.params import param

if TYPE_CHECKING:
    from rlzoo.kernel.registry import PartFactory, Registrar


@dataclass(frozen=True)
class ConsoleParams:
    """A live progress bar with the key metrics of each step.

    Shows reward, validation, length, clip ratio, KL, entropy, grad norm, step time, tokens/s, idle
    ratio and queue; plain log lines instead with ``run.progress=false``."""


@dataclass(frozen=True)
class JsonlParams:
    """One JSON line per logged step in RUN_DIR/metrics.jsonl (what rlzoo plot reads).

    Each line holds ``step``, unix ``time`` and every metric of the step."""


@dataclass(frozen=True)
class TensorBoardParams:
    """TensorBoard scalars in RUN_DIR/tensorboard (tensorboard --logdir RUN_DIR).

    A resumed run drops the events after its checkpoint before writing them again."""


@dataclass(frozen=True)
class WandbParams:
    """Weights & Biases tracking (pip install rlzoo[wandb]): one W&B run per rlzoo run.

    The W&B run is continued on resume (its id is kept in ``RUN_DIR/trackers.json``); a resume
    from an earlier checkpoint rewinds it to the first step it redoes (W&B's ``resume_from``), so
    no step holds values of two branches. The resolved config and the plugin and library versions
    are the run's config. ``WANDB_MODE=offline``, ``WANDB_DIR`` and ``WANDB_API_KEY`` work as
    usual; logging online without a key is refused by ``rlzoo validate``."""

    project: str | None = param(None, help="W&B project (default: run.name)")
    entity: str | None = param(None, help="W&B entity (team or user; default: your default entity)")
    group: str | None = param(None, help="W&B run group (e.g. one sweep)")
    tags: tuple[str, ...] = param((), help="W&B run tags")
    mode: str | None = param(
        None, help="'online', 'offline' or 'disabled' (default: WANDB_MODE, else online)"
    )

    def run_problems(self) -> list[str]:
        """Online W&B needs an API key (:class:`rlzoo.kernel.protocols.RunReadyParams`)."""
        from rlzoo.loggers.trackers import wandb_key_problem

        problem = wandb_key_problem(self.mode)
        return [problem] if problem else []


@dataclass(frozen=True)
class MLflowParams:
    """MLflow tracking (pip install rlzoo[mlflow]): one MLflow run per rlzoo run.

    The MLflow run is continued on resume (its id and absolute tracking URI are kept in
    ``RUN_DIR/trackers.json``). MLflow cannot delete logged points, so a resume from an earlier
    checkpoint, whose steps after it the run already logged, continues in a new MLflow run holding
    the steps up to the checkpoint (tags ``rlzoo.continues`` / ``rlzoo.superseded_by`` link them). The
    resolved config is logged as params (``trainer.backend.lr`` ...), plugin and library versions
    as tags (``rlzoo.version.<name>``). Metric names keep their ``/``; a character MLflow refuses
    (``@`` in ``val/<source>/mean@n``) becomes ``_at_`` / ``_``."""

    experiment: str | None = param(None, help="MLflow experiment name (default: run.name)")
    tracking_uri: str | None = param(
        None,
        help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else MLflow's default); kept as an "
        "absolute URI in RUN_DIR/trackers.json, so a resume from any directory finds the run",
    )

    def run_problems(self) -> list[str]:
        """A file store this MLflow refuses (:class:`rlzoo.kernel.protocols.RunReadyParams`)."""
        from rlzoo.loggers.trackers import mlflow_store_problem

        problem = mlflow_store_problem(self.tracking_uri)
        return [problem] if problem else []


@hookimpl
def rlzoo_register_loggers(registry: Registrar[PartFactory]) -> None:
    registry.register("console", "rlzoo.loggers.builtin:ConsoleLogger", params=ConsoleParams)
    registry.register("jsonl", "rlzoo.loggers.builtin:JsonlLogger", params=JsonlParams)
    registry.register("tensorboard", "rlzoo.loggers.builtin:TensorBoardLogger", params=TensorBoardParams)
    # each tracker needs the distribution of its name, which the extra of that name installs
    for name, cls, params in (
        ("wandb", "WandbLogger", WandbParams),
        ("mlflow", "MLflowLogger", MLflowParams),
    ):
        needs = {"requires": name, "extra": name}
        registry.register(name, f"rlzoo.loggers.trackers:{cls}", params=params, capabilities=needs)
