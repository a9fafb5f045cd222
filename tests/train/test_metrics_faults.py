"""Metrics rows and checkpoints agree after a kill (issue 23, item 8): a kill -9 between a
checkpoint and its metrics row leaves no gap, a row the kill cut in half does not swallow the next
one, and ``rlzoo plot`` on a damaged ``metrics.jsonl`` says which line is wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from run_fixtures import QUIET

from rlzoo.kernel.plugins import PluginManager
from rlzoo.report.metrics import MetricsFileError, read_metrics, set_aside_cut_row
from rlzoo.testing.runs import SIMULATED_BACKENDS

from .test_run_safety import RUNNER

#: run in a child process: the quickstart on the simulated backends, killed with SIGKILL at the
#: moment step 4's metrics row is written (after step 4's checkpoint), in one of two ways
_KILLED_RUN = """
import os, signal, sys
from rlzoo.loggers import builtin

HOW = sys.argv[1]
real_log = builtin.JsonlLogger.log

def log(self, step, record, *, advance=True):
    if step == 4:
        if HOW == "half":  # half the row reaches the file, then the kill
            import json
            line = json.dumps(dict(record)) + "\\n"
            self._file.write(line[: len(line) // 2])
            self._file.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    real_log(self, step, record, advance=advance)

builtin.JsonlLogger.log = log
from rlzoo.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _killed_at_step_4(how: str, quickstart_dir: Path, out: Path, runner: list[str]) -> None:
    cmd = [
        sys.executable,
        "-c",
        textwrap.dedent(_KILLED_RUN),
        how,
        "train",
        "quickstart",
        f"data.dir={quickstart_dir}",
        f"run.output_dir={out}",
        *QUIET,
        *SIMULATED_BACKENDS,
        *runner,
        "run.loggers=[jsonl,tensorboard]",
        "trainer.test_freq=-1",
        "trainer.total_steps=6",
        "trainer.save_freq=2",
    ]
    env = {**os.environ, "RLZOO_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == -9, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (out / "checkpoints" / "step_4").is_dir()


@pytest.mark.parametrize(
    ("how", "runner"),
    [("before", "sync"), ("before", "one_step_off"), ("before", "fully_async"), ("half", "sync")],
)
def test_a_kill_between_a_checkpoint_and_its_row_leaves_no_gap(
    how: str, runner: str, pm: PluginManager, quickstart_dir: Path, tmp_path: Path
) -> None:
    """Before: the resume started after step 4's checkpoint, so step 4 never got a row; a half row
    joined the next one ('{"step": 4, "ti{"step": 5, ...}') and read_metrics raised JSONDecodeError."""
    out = tmp_path / "run"
    _killed_at_step_4(how, quickstart_dir, out, RUNNER[runner])
    import rlzoo

    summary = rlzoo.build_run(
        "quickstart", ["resume=latest", f"run.output_dir={out}", "trainer.total_steps=6"], pm=pm
    ).train()
    assert summary["start_step"] == 4
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # step 4's row, from its checkpoint
    assert isinstance(rows[3]["critic/score/mean"], float)
    cut = sorted(out.glob("metrics.cut.*.jsonl"))
    if how == "half":  # the half row is kept aside, not deleted
        assert len(cut) == 1 and cut[0].read_text().startswith('{"step": 4')
    else:
        assert cut == []
    # TensorBoard has each step once, step 4 included
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    # (sorted: the killed and the resumed process may write their event files in the same second,
    # and the reader orders files by name)
    assert sorted(e.step for e in acc.Scalars("critic/score/mean")) == [1, 2, 3, 4, 5, 6]


def test_a_cut_last_row_is_set_aside_and_skipped_by_readers(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "x": 0.')
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]  # a write cut short: skipped
    side = set_aside_cut_row(path)
    assert side is not None and side.read_text() == '{"step": 3, "x": 0.\n'
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
    assert set_aside_cut_row(path) is None  # whole now


def test_plot_on_a_damaged_file_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `rlzoo plot` died with a raw JSONDecodeError traceback."""
    from rlzoo.cli import main

    run = tmp_path / "run"
    run.mkdir()
    rows = [json.dumps({"step": i, "critic/score/mean": 0.1 * i}) for i in (1, 2, 3)]
    (run / "metrics.jsonl").write_text(rows[0] + "\n" + rows[1][:20] + rows[2] + "\n")
    with pytest.raises(MetricsFileError, match=r"line 2 is not JSON"):
        read_metrics(run)
    assert main(["plot", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'metrics.jsonl'}: line 2 is not JSON" in err and "Traceback" not in err
