"""Loggers (kind ``logger``): a third-party logger through rlzoo_register_loggers, validation of a
missing tracker package, and W&B (offline) and MLflow (local file store) runs read back.

The trackers are tested for real, offline: W&B writes its ``.wandb`` run file (read back here with
wandb's own protobuf schema), MLflow a local file store (read back through MLflow's client). Both
must hold the same numbers as ``metrics.jsonl``, the resolved config and the plugin versions, and a
resumed rlzoo run must continue the same tracker run.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import struct
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import rlzoo
from rlzoo.kernel.errors import ConfigError
from rlzoo.kernel.plugins import PluginManager
from rlzoo.report.metrics import LoggerContext, MetricsLogger, read_metrics
from rlzoo.testing import LoggerConformance

QUIET = ["run.progress=false", "trainer.val_before_train=false"]


# ---------------------------------------------------------------------------------------------
# the hook: a third party adds a logger
# ---------------------------------------------------------------------------------------------
class ListLogger:
    """Keeps every record in memory (a third-party logger)."""

    received: list[tuple[int, dict[str, Any]]] = []
    contexts: list[LoggerContext] = []

    def __init__(self, params: Any, context: LoggerContext) -> None:
        self.prefix = params.prefix
        ListLogger.contexts.append(context)

    def log(self, step: int, record: Mapping[str, Any], *, advance: bool = True) -> None:
        ListLogger.received.append((step, {f"{self.prefix}{k}": v for k, v in record.items()}))

    def close(self) -> None:
        ListLogger.received.append((-1, {}))


class ListPlugin:
    @rlzoo.hookimpl
    def rlzoo_register_loggers(self, registry):  # type: ignore[no-untyped-def]
        from dataclasses import dataclass

        from rlzoo.kernel.params import param

        @dataclass(frozen=True)
        class ListParams:
            """Records in a Python list (tests)."""

            prefix: str = param("", help="prepended to every key")

        registry.register("memory", ListLogger, params=ListParams)


@pytest.fixture
def with_memory_logger() -> Iterator[PluginManager]:
    pm = rlzoo.get_plugin_manager()
    pm.register(ListPlugin(), "memory_logger")
    ListLogger.received.clear()
    ListLogger.contexts.clear()
    yield pm
    pm.unregister("memory_logger")


def test_a_third_party_logger_gets_every_record(with_memory_logger: PluginManager, tmp_path: Path) -> None:
    from rlzoo.recipe.config import load_config

    assert "memory" in with_memory_logger.registry("logger")
    cfg = load_config(
        {"model": {"path": "m"}, "data": {"train_files": ["t.parquet"]}, "rollout": {"n": 2}},
        ["run.loggers=[jsonl, {name: memory, prefix: x_}]"],
        with_memory_logger,
    )
    assert [s.name for s in cfg.run.loggers] == ["jsonl", "memory"]
    assert cfg.run.loggers[1].params.prefix == "x_"
    assert {s.key for s in cfg.selections()} >= {"run.loggers[0]", "run.loggers[1]"}
    (tmp_path / "config.yaml").write_text("run: {name: exp}\n")
    m = MetricsLogger(tmp_path, cfg.run.loggers, progress=False)
    m.log(1, {"a": 1, "b": float("nan"), "note": "kept"})
    m.close()
    assert ListLogger.received[0] == (
        1,
        {
            "x_step": 1,
            "x_time": pytest.approx(m.history[0]["time"]),
            "x_a": 1.0,
            "x_b": None,
            "x_note": "kept",
        },
    )
    assert ListLogger.received[-1] == (-1, {})  # closed
    ctx = ListLogger.contexts[0]
    assert ctx.run_dir == tmp_path and ctx.run_name == "exp" and ctx.run_id == tmp_path.name
    assert read_metrics(tmp_path)[0]["a"] == 1.0  # the jsonl logger got the same record


# the conformance suite a plugin runs against its own logger, on the built-ins
class TestConsoleLogger(LoggerConformance):
    name = "console"


class TestJsonlLogger(LoggerConformance):
    name = "jsonl"

    def test_writes_every_record(self, tmp_path: Path) -> None:
        self.test_takes_every_record_and_closes(tmp_path)
        assert read_metrics(tmp_path) == self.records()


class TestTensorBoardLogger(LoggerConformance):
    name = "tensorboard"


def test_an_unknown_logger_lists_the_registered_ones() -> None:
    from rlzoo.recipe.config import load_config

    with pytest.raises(ConfigError) as e:
        load_config("quickstart", ["run.loggers=[console,wandbb]"])
    text = str(e.value)
    assert "run.loggers[1].name" in text and "wandb" in text


def test_validate_rejects_a_tracker_whose_package_is_missing(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    hide_distribution: Callable[[str], None],
) -> None:
    from rlzoo.cli import main

    hide_distribution("wandb")
    real_spec = importlib.util.find_spec  # nor its import package (another build of it would count)
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real_spec(n, *a))
    assert main(["validate", "quickstart", "run.loggers=[console,wandb]"]) == 2
    err = capsys.readouterr().err
    assert "run.loggers[1]: logger 'wandb' needs the package 'wandb'" in err
    assert "pip install rlzoo[wandb]" in err
    out = tmp_path / "never"
    assert main(["train", "quickstart", "run.loggers=[wandb]", f"run.output_dir={out}"]) == 2
    assert not out.exists()  # rejected before any run directory is created


# ---------------------------------------------------------------------------------------------
# W&B offline and MLflow, for real
# ---------------------------------------------------------------------------------------------
def wandb_records(run_file: Path) -> list[Any]:
    """The protobuf records of a W&B ``.wandb`` run file.

    The file is W&B's LevelDB-style log (a 7-byte ``:W&B`` header, then 32 KiB blocks of chunks,
    each ``crc32 (4) | length (2) | type (1)``: 1 full, 2 first, 3 middle, 4 last); each record is a
    ``wandb_internal_pb2.Record`` (wandb's own schema).
    """
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, out, buf = 32768, 7, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and length == 0:  # zero padding to the end of the block
            pos += left - 7
            continue
        chunk, pos = data[pos : pos + length], pos + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            out.append(buf + chunk)
    records = []
    for raw in out:
        rec = pb.Record()
        rec.ParseFromString(raw)
        records.append(rec)
    return records


def wandb_run(run_file: Path) -> tuple[str, dict[str, Any], dict[int, dict[str, Any]]]:
    """(run id, config, {step: metrics}) of a W&B offline run file."""
    run_id, config, history = "", {}, {}
    for rec in wandb_records(run_file):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            run_id = rec.run.run_id
            config.update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in rec.config.update})
        elif kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            history[int(items["_step"])] = items
    return run_id, config, history


@pytest.fixture(scope="module")
def tracked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A 3-step quickstart run logged to jsonl + W&B (offline) + MLflow (file store), then resumed
    to step 5."""
    pytest.importorskip("wandb", reason="pip install rlzoo[wandb] (the dev extra installs it)")
    pytest.importorskip("mlflow", reason="pip install rlzoo[mlflow] (the dev extra installs it)")
    from rlzoo.recipe.compose import build_run
    from rlzoo.tasks._quickstart import prepare
    from rlzoo.tasks.quickstart import QuickstartDataParams

    root = tmp_path_factory.mktemp("trackers")
    data = root / "data"
    prepare(data, QuickstartDataParams())
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_DIR", str(root / "wandb"))
    mp.setenv("WANDB_SILENT", "true")
    mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store in maintenance mode
    (root / "wandb").mkdir()
    uri = f"file://{root / 'mlruns'}"
    run_dir = root / "run"
    common = [
        *QUIET,
        f"data.dir={data}",
        "trainer.save_freq=1",
        f"run.output_dir={run_dir}",
        f"run.loggers=[jsonl,{{name:wandb,project:rlzoo-test}},{{name:mlflow,experiment:rlzoo-test,tracking_uri:'{uri}'}}]",
    ]
    try:
        build_run("quickstart", [*common, "trainer.total_steps=3"]).train()
        first = json.loads((run_dir / "trackers.json").read_text())
        build_run("quickstart", [*common, "trainer.total_steps=5", "resume=true"]).train()
        yield {"run_dir": run_dir, "uri": uri, "first": first, "root": root}
    finally:
        mp.undo()


def test_mlflow_holds_what_metrics_jsonl_holds(tracked: dict[str, Any]) -> None:
    from mlflow.tracking import MlflowClient

    from rlzoo.loggers.trackers import mlflow_name

    run_dir = tracked["run_dir"]
    trackers = json.loads((run_dir / "trackers.json").read_text())
    assert trackers["mlflow"]["run_id"] == tracked["first"]["mlflow"]["run_id"]  # resume: same run
    client = MlflowClient(tracking_uri=tracked["uri"])
    run = client.get_run(trackers["mlflow"]["run_id"])
    assert run.info.run_name == run_dir.name
    assert client.get_experiment(run.info.experiment_id).name == "rlzoo-test"
    # the resolved config as params, plugin versions as tags
    assert run.data.params["trainer.total_steps"] == "3"  # as the run started
    assert run.data.params["algorithm.advantage.name"] == "grpo"
    assert run.data.tags["rlzoo.version.rlzoo"] == md.version("rlzoo")
    assert "rlzoo.version.rlzoo.loggers" in run.data.tags
    records = read_metrics(run_dir)
    assert sorted({r["step"] for r in records}) == [1, 2, 3, 4, 5]
    keys = {k for r in records for k, v in r.items() if k not in ("step", "time") and isinstance(v, float)}
    assert "critic/score/mean" in keys and "response_length/clip_ratio" in keys
    for key in keys:
        history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, mlflow_name(key))}
        expected = {r["step"]: r[key] for r in records if isinstance(r.get(key), float)}
        assert history == pytest.approx(expected), key


def test_wandb_offline_holds_what_metrics_jsonl_holds(tracked: dict[str, Any]) -> None:
    run_dir = tracked["run_dir"]
    trackers = json.loads((run_dir / "trackers.json").read_text())
    run_id = trackers["wandb"]["id"]
    assert run_id == tracked["first"]["wandb"]["id"]  # resume: same W&B run
    files = sorted((tracked["root"] / "wandb").glob("wandb/offline-run-*/run-*.wandb"))  # WANDB_DIR
    assert len(files) == 2  # the first process and the resumed one
    records = read_metrics(run_dir)
    history: dict[int, dict[str, Any]] = {}
    for f in files:
        got_id, config, hist = wandb_run(f)
        assert got_id == run_id
        history.update(hist)
    assert config["trainer"]["total_steps"] in (3, 5)
    assert config["algorithm"]["advantage"]["name"] == "grpo"
    assert config["rlzoo_versions"]["rlzoo"] == md.version("rlzoo")
    assert sorted(history) == [1, 2, 3, 4, 5]
    for r in records:
        for k, v in r.items():
            if k not in ("step", "time") and isinstance(v, float):
                assert history[r["step"]][k] == pytest.approx(v), (r["step"], k)


def test_a_full_disk_during_a_metrics_write_names_the_file(tmp_path) -> None:
    """Issue 39, finding 11: the disk fills up as a row is written (the write raises ENOSPC, as a
    full disk does). Before: "cannot write: No space left on device", no file named."""
    import errno

    from rlzoo.loggers.builtin import JsonlLogger
    from rlzoo.report.metrics import LoggerContext
    from rlzoo.system.storage import storage_message

    sink = JsonlLogger(None, LoggerContext(run_dir=tmp_path))

    class _FullDisk:
        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self) -> None: ...

        def close(self) -> None: ...

    sink._file = _FullDisk()  # type: ignore[assignment]
    with pytest.raises(OSError) as info:
        sink.log(1, {"step": 1})
    assert storage_message(info.value) == (
        f"cannot write {tmp_path / 'metrics.jsonl'}: No space left on device; free some space or choose a "
        "writable folder (run.output_dir=DIR)"
    )
