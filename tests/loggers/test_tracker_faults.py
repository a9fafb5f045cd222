"""Trackers under resumes and mistakes (issue 23, item 7 and the W&B key of item 10): MLflow finds
its run from any working directory, a file store MLflow refuses is caught by ``validate``, and a
resume that redoes steps never puts a step twice into MLflow's or W&B's history. Offline, for real:
MLflow on a local SQLite store, W&B in offline mode (its ``.wandb`` file read back)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlzoo.kernel.errors import ConfigError
from rlzoo.kernel.plugins import PluginManager
from rlzoo.recipe.config import load_config
from rlzoo.report.metrics import read_metrics
from rlzoo.testing.runs import SIMULATED_BACKENDS

from .test_loggers import wandb_records, wandb_run

QUIET = ["run.progress=false", "trainer.val_before_train=false"]


@pytest.fixture
def pm() -> PluginManager:
    return PluginManager(load_entrypoints=False)


pytest.importorskip("mlflow", reason="pip install rlzoo[mlflow] (the dev extra installs it)")
pytest.importorskip("wandb", reason="pip install rlzoo[wandb] (the dev extra installs it)")


def _train(pm: PluginManager, quickstart_dir: Path, out: Path, *extra: str) -> dict[str, Any]:
    import rlzoo

    return rlzoo.build_run(
        "quickstart",
        [
            f"data.dir={quickstart_dir}",
            f"run.output_dir={out}",
            *QUIET,
            *SIMULATED_BACKENDS,
            "trainer.test_freq=-1",
            *extra,
        ],
        pm=pm,
    ).train()


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "wandb").mkdir()
    return tmp_path


def test_mlflow_resume_from_another_directory_finds_the_run(
    offline: Path, pm: PluginManager, quickstart_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: MLflow's default store (sqlite:///mlflow.db) is relative to the working directory,
    and the resume looked there: 'Run ... not found'."""
    from mlflow.tracking import MlflowClient

    out = offline / "run"
    first_cwd, other_cwd = offline / "here", offline / "elsewhere"
    first_cwd.mkdir()
    other_cwd.mkdir()
    monkeypatch.chdir(first_cwd)
    loggers = "run.loggers=[jsonl,{name:mlflow,experiment:faults}]"
    _train(pm, quickstart_dir, out, loggers, "trainer.total_steps=2", "trainer.save_freq=2")
    state = json.loads((out / "trackers.json").read_text())["mlflow"]
    assert state["tracking_uri"] == f"sqlite:///{first_cwd / 'mlflow.db'}"  # absolute
    monkeypatch.chdir(other_cwd)
    _train(pm, quickstart_dir, out, "resume=latest", "trainer.total_steps=4")
    assert not (other_cwd / "mlflow.db").exists()
    after = json.loads((out / "trackers.json").read_text())["mlflow"]
    assert after["run_id"] == state["run_id"]  # the same MLflow run, continued
    history = MlflowClient(state["tracking_uri"]).get_metric_history(state["run_id"], "critic/score/mean")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]


def test_redone_steps_appear_once_in_mlflow_and_wandb(
    offline: Path, pm: PluginManager, quickstart_dir: Path
) -> None:
    """Before: resume=2 after step 4 logged steps 3 and 4 a second time into the same MLflow run
    (MLflow keeps both points), and W&B (online) drops a step below its current one, so the
    abandoned branch's values stayed."""
    from mlflow.tracking import MlflowClient

    from rlzoo.loggers.trackers import mlflow_name

    out = offline / "run"
    uri = f"sqlite:///{offline / 'mlflow.db'}"
    loggers = f"run.loggers=[jsonl,{{name:wandb,project:faults}},{{name:mlflow,experiment:faults,tracking_uri:'{uri}'}}]"
    _train(pm, quickstart_dir, out, loggers, "trainer.total_steps=4", "trainer.save_freq=2")
    first = json.loads((out / "trackers.json").read_text())
    _train(pm, quickstart_dir, out, "resume=2", "trainer.total_steps=4")
    rows = {r["step"]: r for r in read_metrics(out)}
    assert sorted(rows) == [1, 2, 3, 4]
    now = json.loads((out / "trackers.json").read_text())

    # MLflow: a new run holds steps 1-2 (copied) and the redone 3-4, each once
    client = MlflowClient(uri)
    old_id, new_id = first["mlflow"]["run_id"], now["mlflow"]["run_id"]
    assert new_id != old_id
    assert client.get_run(old_id).data.tags["rlzoo.superseded_by"] == new_id
    new = client.get_run(new_id)
    assert new.data.tags["rlzoo.continues"] == old_id and new.data.tags["rlzoo.resumed_at_step"] == "2"
    assert new.data.params["trainer.total_steps"] == "4"
    for key in ("critic/score/mean", "timing_s/step", "actor/pg_loss"):
        points = client.get_metric_history(new_id, mlflow_name(key))
        assert sorted(m.step for m in points) == [1, 2, 3, 4], key
        assert {m.step: m.value for m in points} == pytest.approx({s: r[key] for s, r in rows.items()}), key

    # W&B: the same run, rewound to step 2 by the resume (W&B keeps steps <= 2 and takes 3 next);
    # the resumed file logs 3 and 4 once
    assert now["wandb"]["id"] == first["wandb"]["id"]
    files = sorted((offline / "wandb").glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 2
    run_id, _, history = wandb_run(files[1])
    assert run_id == first["wandb"]["id"] and sorted(history) == [3, 4]
    branch = [r.run.branch_point for r in wandb_records(files[1]) if r.WhichOneof("record_type") == "run"]
    assert branch and branch[0].run == run_id and branch[0].value == 2


def _problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config("quickstart", list(overrides))
    return list(e.value.problems)


def test_a_file_store_mlflow_refuses_is_caught_by_validate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Before: validate passed and the run crashed at train start inside MLflow (maintenance mode)."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"file://{tmp_path / 'mlruns'}"
    (got,) = _problems(f"run.loggers=[jsonl,{{name:mlflow,tracking_uri:'{uri}'}}]")
    assert got.startswith(f"run.loggers[1]: tracking_uri '{uri}' is an MLflow file store")
    assert "MLFLOW_ALLOW_FILE_STORE=true" in got and "sqlite:///" in got
    monkeypatch.setenv("MLFLOW_TRACKING_URI", str(tmp_path / "mlruns"))  # a plain path is a file store too
    (got,) = _problems("run.loggers=[jsonl,mlflow]")
    assert "MLFLOW_TRACKING_URI" in got
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the user's opt-in: fine
    load_config("quickstart", [f"run.loggers=[jsonl,{{name:mlflow,tracking_uri:'{uri}'}}]"])


def test_wandb_without_a_key_is_refused_by_validate_with_what_to_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Before: validate passed and wandb.init raised 'No API key configured' from inside W&B."""
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # no entry
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    (got,) = _problems("run.loggers=[jsonl,wandb]")
    assert got.startswith("run.loggers[1]: W&B logs online here and finds no API key for api.wandb.ai")
    assert "export WANDB_API_KEY=" in got and "mode: offline" in got and "wandb sync" in got
    # offline needs no key, by the param, WANDB_MODE or `wandb offline`'s settings file
    load_config("quickstart", ["run.loggers=[jsonl,{name:wandb,mode:offline}]"])
    (tmp_path / "wandb-config").mkdir()
    (tmp_path / "wandb-config" / "settings").write_text("[default]\nmode = offline\n")
    load_config("quickstart", ["run.loggers=[jsonl,wandb]"])
    (tmp_path / "wandb-config" / "settings").unlink()
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password abc123\n")
    (tmp_path / "netrc").chmod(0o600)
    load_config("quickstart", ["run.loggers=[jsonl,wandb]"])  # `wandb login` wrote the key
