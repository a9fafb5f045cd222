"""Samples kept with the run (``run.samples``, :mod:`rlzoo.train.samples`): one Parquet file per
step, whole or absent after a kill -9, each step exactly once after a resume, the multi-turn rows
telling the model's tokens from the environment's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_fixtures import QUIET

import rlzoo
from rlzoo.kernel.errors import RlzooError
from rlzoo.report.samples import COLUMNS, MARK, read_samples, sample_steps, samples_dir

STEPS = 6
COMMON = [
    f"trainer.total_steps={STEPS}",
    "trainer.save_freq=2",
    "trainer.test_freq=3",
    "data.train_batch_size=4",
    "rollout.n=2",
    "trainer.ppo_mini_batch_size=4",
    "run.samples.max_per_step=5",
]


#: ``rlzoo train`` whose Parquet writes each take 0.5 s more: a step's samples are still being
#: written while the trainer goes on (a background writer's race made sure to show)
SLOW_WRITER = (
    "import sys, time; import pyarrow.parquet as pq; w = pq.write_table; "
    "pq.write_table = lambda *a, **k: (time.sleep(0.5), w(*a, **k))[1]; "
    "from rlzoo.cli import main; sys.argv[0] = 'rlzoo'; sys.exit(main())"
)


def _train(args: list[str], kill_at: str | None, log: Path, slow_writer: bool = False) -> int:
    env = {**os.environ, "RLZOO_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("RLZOO_KILL_AT", None)
    if kill_at:
        env["RLZOO_KILL_AT"] = kill_at
    with open(log, "ab") as fh:
        head = ["-c", SLOW_WRITER] if slow_writer else ["-m", "rlzoo.cli"]
        cmd = [sys.executable, *head, "train", *args]
        return subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=300).returncode


@pytest.mark.slow  # three interpreter starts: ~25 s
def test_kill_9_mid_run_then_resume_keeps_every_step_once(quickstart_dir: Path, tmp_path: Path) -> None:
    out, log = tmp_path / "run", tmp_path / "log.txt"
    args = ["quickstart", f"data.dir={quickstart_dir}", *QUIET, *COMMON, f"run.output_dir={out}"]
    # killed with step 5's samples file staged under its temporary name (checkpoint of step 4; the
    # 6th staged file: steps 1-3, step 3's validation, steps 4 and 5)
    assert _train(args, "samples:staged@6", log) == -9, log.read_text()[-3000:]
    assert sample_steps(out) == [1, 2, 3, 4]
    assert any(f.name.startswith(".step_000005") for f in samples_dir(out).iterdir())  # the cut write
    (samples_dir(out) / "notes.txt").write_text("mine")  # a user's file: never touched
    resume = ["resume=latest", f"run.output_dir={out}"]
    # killed again after step 5's row was written: step 5's samples (written in the background) may
    # be cut; those of the checkpointed steps are there; the resume (from step 4) redoes step 5
    assert _train(resume, "metrics:after@1", log) == -9, log.read_text()[-3000:]
    assert sample_steps(out)[:4] == [1, 2, 3, 4] and set(sample_steps(out)) <= {1, 2, 3, 4, 5}
    assert _train(resume, None, log) == 0, log.read_text()[-3000:]

    assert sample_steps(out) == list(range(1, STEPS + 1))
    rows = read_samples(out)
    # 4 prompts x 2 responses = 8 samples per step, 5 kept (max_per_step); each step's once
    assert [r["step"] for r in rows] == [k for k in range(1, STEPS + 1) for _ in range(5)]
    assert len({(r["step"], r["uid"]) for r in rows}) == len(rows)
    assert not [f for f in samples_dir(out).iterdir() if f.name.startswith(".")]  # no leftovers
    assert (samples_dir(out) / "notes.txt").read_text() == "mine"
    # validation at step 3 and at the end (test_freq=3; none before training)
    assert sample_steps(out, "val") == [3, 6]


@pytest.mark.slow  # two interpreter starts: ~20 s
def test_kill_9_after_a_checkpoint_keeps_the_background_writers_rows_once(
    quickstart_dir: Path, tmp_path: Path
) -> None:
    """Issue 38: the samples are written in the background (0.5 s more a file here, so a write is
    still in flight when the trainer moves on). Killed -9 right after step 4's checkpoint: the rows
    of steps 1-4 are there (flushed before the checkpoint), step 3's validation too; resumed, every
    step's rows are there exactly once."""
    out, log = tmp_path / "run", tmp_path / "log.txt"
    args = ["quickstart", f"data.dir={quickstart_dir}", *QUIET, *COMMON, f"run.output_dir={out}"]
    assert _train(args, "save:committed@2", log, slow_writer=True) == -9, log.read_text()[-3000:]
    assert sample_steps(out) == [1, 2, 3, 4] and sample_steps(out, "val") == [3]
    assert [r["step"] for r in read_samples(out)] == [k for k in range(1, 5) for _ in range(5)]
    resume = ["resume=latest", f"run.output_dir={out}"]
    assert _train(resume, None, log, slow_writer=True) == 0, log.read_text()[-3000:]
    rows = read_samples(out)
    assert [r["step"] for r in rows] == [k for k in range(1, STEPS + 1) for _ in range(5)]
    assert len({(r["step"], r["uid"]) for r in rows}) == len(rows)
    assert sample_steps(out, "val") == [3, 6]
    assert not [f for f in samples_dir(out).iterdir() if f.name.startswith(".")]


def test_the_background_writer_waits_one_step_and_fails_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next step's samples wait for the previous step's file; flush waits for all; a failed
    write (not a refusing disk) is raised at the next flush, naming the step."""
    import threading
    import time

    from rlzoo.recipe.types import SamplesSection
    from rlzoo.train.samples import SampleWriter

    w = SampleWriter(tmp_path, SamplesSection(), None)
    gate = threading.Event()
    done: list[int] = []

    def slow_write(step: int, rows: object, split: str = "train") -> None:
        gate.wait(10)
        done.append(step)

    monkeypatch.setattr(w, "write", slow_write)
    monkeypatch.setattr(w, "train_rows", lambda step, *a: [{"step": step}])
    t0 = time.perf_counter()
    w.write_train(1, None, None, int)  # type: ignore[arg-type]
    assert time.perf_counter() - t0 < 1.0 and done == []  # handed to the background: no wait
    threading.Timer(0.3, gate.set).start()
    w.write_train(2, None, None, int)  # type: ignore[arg-type]
    assert done == [1]  # step 1's write finished before step 2's was handed in
    w.flush()
    assert done == [1, 2]

    def broken(step: int, *a: object) -> list[dict[str, object]]:
        raise ValueError("a column the schema lacks")

    monkeypatch.setattr(w, "train_rows", broken)
    w.write_train(3, None, None, int)  # type: ignore[arg-type]
    with pytest.raises(
        RlzooError, match=r"step 3's train samples .* failed: ValueError..a column the schema lacks"
    ):
        w.flush()
    w.close()


def test_schema_and_per_token_columns(quickstart_dir: Path, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = tmp_path / "run"
    over = [f"data.dir={quickstart_dir}", *QUIET, *COMMON, f"run.output_dir={out}", "trainer.total_steps=2"]
    rlzoo.build_run("quickstart", over).train()
    f = samples_dir(out) / "step_000002.parquet"
    schema = pq.read_schema(f)
    assert schema.names == list(COLUMNS)
    assert (schema.metadata or {}).get(MARK) is not None
    assert schema.field("response_ids").type.value_type == pa.int32()
    assert schema.field("logprobs").type.value_type == pa.float32()
    for r in read_samples(out, 2):
        n = r["response_length"]
        assert n == len(r["response_ids"]) == len(r["tokens"]) == len(r["logprobs"]) == len(r["model_mask"])
        assert len(r["versions"]) == len(r["advantages"]) == len(r["token_rewards"]) == n
        assert "".join(r["tokens"]).strip() == r["response"].strip()  # the pieces read as the text
        assert all(v == 1 for v in r["versions"])  # step 2 was generated after the first push
        assert all(lp <= 0 for lp in r["logprobs"])
        # the reward sits on the last token (a single-turn sample): the row sums to the reward
        assert r["reward"] == pytest.approx(sum(r["token_rewards"]))
    # without tokens: texts and numbers only
    out2 = tmp_path / "run2"
    rlzoo.build_run(
        "quickstart",
        [*over[:-2], f"run.output_dir={out2}", "trainer.total_steps=1", "run.samples.keep_tokens=false"],
    ).train()
    r = read_samples(out2, 1)[0]
    assert r["response"] is not None and r["response_ids"] is None and r["logprobs"] is None


def test_a_file_rlzoo_did_not_write_is_never_replaced(tmp_path: Path) -> None:
    from rlzoo.recipe.types import SamplesSection
    from rlzoo.report.samples import step_file
    from rlzoo.train.samples import SampleWriter

    class Tok:
        def decode(self, ids: list[int]) -> str:
            return " ".join(map(str, ids))

    w = SampleWriter(tmp_path, SamplesSection(), Tok(), resumed_from=0)
    theirs = step_file(tmp_path, 3)
    theirs.parent.mkdir(parents=True)
    theirs.write_bytes(b"not ours")
    with pytest.raises(RlzooError, match="not written by rlzoo"):
        w.write(3, [{"step": 3, "split": "train", "uid": "a/0"}])
    assert theirs.read_bytes() == b"not ours"
    # rlzoo's own file of that step is replaced
    assert w.write(4, [{"step": 4, "split": "train", "uid": "a/0"}]) is not None
    assert w.write(4, [{"step": 4, "split": "train", "uid": "b/0"}]) is not None
    assert [r["uid"] for r in read_samples(tmp_path, 4)] == ["b/0"]


def test_multi_turn_rows_mark_model_and_environment_tokens(tmp_path: Path) -> None:
    out = tmp_path / "run"
    rlzoo.build_run(
        "quickstart_tools",
        [
            f"data.dir={tmp_path / 'data'}",
            f"run.output_dir={out}",
            *QUIET,
            "trainer.total_steps=1",
            "trainer.test_freq=-1",
            "data.train_batch_size=8",
            "trainer.ppo_mini_batch_size=8",
        ],
    ).train()
    rows = read_samples(out, 1)
    assert rows
    for r in rows:
        agent = __import__("json").loads(r["agent"])
        assert r["model_tokens"] == sum(r["model_mask"]) == agent["model_tokens"]
        assert r["response_length"] - r["model_tokens"] == agent["env_tokens"]
        assert r["turns"] == agent["turns"]
    # some trajectory called the tool: its response mixes model (1) and environment (0) tokens, and
    # the environment's tokens get no advantage
    mixed = [r for r in rows if 0 in r["model_mask"] and 1 in r["model_mask"]]
    assert mixed, [r["response"] for r in rows]
    for r in mixed:
        assert all(a == 0.0 for a, m in zip(r["advantages"], r["model_mask"]) if m == 0)
        assert r["tool_calls"] >= 1


def test_a_disk_that_refuses_the_samples_file_is_a_warning_not_a_dead_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import errno

    import pyarrow.parquet as pq

    from rlzoo.recipe.types import SamplesSection
    from rlzoo.train.samples import SampleWriter

    def full(table: object, where: object, **kw: object) -> None:
        Path(str(where)).write_bytes(b"half")  # as a write cut by the disk leaves it
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    w = SampleWriter(tmp_path, SamplesSection(), None)
    with caplog.at_level("WARNING", logger="rlzoo"):
        assert w.write(2, [{"step": 2, "split": "train", "uid": "a/0"}]) is None
    assert "could not write step 2's samples" in caplog.text
    assert list(samples_dir(tmp_path).iterdir()) == []  # nothing half-written left
