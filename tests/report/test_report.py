"""``rlzoo plot RUN_DIR``: PNG learning curves and summary.md from a run directory's files."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from rlzoo.kernel.errors import RlzooError
from rlzoo.report import (
    PANELS,
    RunData,
    _draw,
    ema,
    metric_table,
    plot_run,
    plot_runs,
    rolling_mean,
    series,
    summarize_run,
    timing_table,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(run_dir: Path, records: list[dict[str, Any]]) -> Path:
    """A run directory as a runner leaves it: metrics.jsonl, config.yaml, plugins.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "metrics.jsonl").open("w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    (run_dir / "config.yaml").write_text(
        "recipe: dapo_math\n"
        "run: {name: dapo_math, seed: 0}\n"
        "model: {path: Qwen/Qwen2.5-Math-7B}\n"
        "algorithm:\n"
        "  advantage: {name: grpo, plugin: rlzoo.algorithms.advantage, norm_by_std: true}\n"
        "  policy_loss: {name: ppo_clip, plugin: rlzoo.algorithms.policy_loss, clip_ratio_low: 0.2, clip_ratio_high: 0.28}\n"
        "  loss_agg: {name: token-mean, plugin: rlzoo.algorithms.loss_agg}\n"
        "  use_kl_loss: false\n"
        "reward:\n"
        "  manager: {name: dapo, plugin: rlzoo.algorithms.reward, overlong_buffer_len: 4096, penalty_factor: 1.0}\n"
        "  scorer: {name: dapo_math, plugin: rlzoo.algorithms.scorers}\n"
        "rollout: {n: 16, val: {n: 32, temperature: 1.0}}\n"
        "trainer: {val_before_train: true, test_freq: 2}\n"
        "runner: {name: fully_async, plugin: my_async_plugin}\n"
        "placement: {name: ray, colocate: false, trainer: {nnodes: 1, n_gpus_per_node: 4},"
        " rollout: {nnodes: 1, n_gpus_per_node: 4}}\n"
    )
    (run_dir / "plugins.json").write_text(
        json.dumps(
            {
                "plugins": [
                    {
                        "name": "rlzoo.algorithms.advantage",
                        "version": "0.1.0",
                        "builtin": True,
                        "status": "loaded",
                    },
                    {"name": "rlzoo.backends.vllm", "version": "0.1.0", "builtin": True, "status": "loaded"},
                    {
                        "name": "my_async_plugin",
                        "version": "1.2.3",
                        "builtin": False,
                        "distribution": "my-async",
                        "status": "loaded",
                    },
                ]
            }
        )
    )
    return run_dir


def records() -> list[dict[str, Any]]:
    """Step 0: validation only; steps 1-4: training (async keys too); validation at 2 and 4."""
    out: list[dict[str, Any]] = [
        {
            "step": 0,
            "time": 1000.0,
            "val/math_dapo/mean@32": 0.0,
            "val/math_dapo/maj@32": 0.0,
            "val/math_dapo/best@32": 0.1,
            "val/mean": 0.0,
        }
    ]
    scores = [0.1, 0.3, 0.2, 0.5]
    for i, s in enumerate(scores, start=1):
        r: dict[str, Any] = {
            "step": i,
            "time": 1000.0 + 60.0 * i,
            "critic/score/mean": s,
            "critic/score/min": s - 1,
            "critic/score/max": s + 1,
            "response_length/mean": 800.0 + 10 * i,
            "response_length/clip_ratio": 0.01 * i,
            "actor/pg_clipfrac": 0.002,
            "actor/entropy": 0.5,
            "trainer/idle_ratio": 0.09 - 0.01 * i,
            "queue/size": 100.0 + i,
            "perf/throughput": 2000.0 + 100 * i,
            "timing_s/gen": 30.0,
            "timing_s/update_actor": 20.0,
            "timing_s/step": 50.0 + i,
            "note": "strings are kept but not plotted",
        }
        if i in (2, 4):
            r.update(
                {
                    "val/math_dapo/mean@32": 0.1 * i,
                    "val/math_dapo/maj@32": 0.12 * i,
                    "val/math_dapo/best@32": 0.3,
                    "val/mean": 0.1 * i,
                }
            )
        out.append(r)
    out[2]["actor/entropy"] = None  # a non-finite value logged as null is skipped
    return out


def test_series_skips_missing_and_null_and_keeps_the_last_of_a_repeated_step() -> None:
    recs = [
        {"step": 1, "a": 1.0},
        {"step": 2, "a": None},
        {"step": 3},
        {"step": 3, "a": 5.0},
        {"step": 3, "a": 6.0},
    ]
    assert series(recs, "a") == ([1, 3], [1.0, 6.0])


def test_plot_run_writes_a_png_per_panel_an_overview_and_a_summary(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", records())
    files = plot_run(run)
    names = [p.name for p in files]
    assert names[0] == "overview.png" and names[-1] == "summary.md"
    assert set(names) == {
        "overview.png",
        "reward.png",
        "validation.png",
        "response_length.png",
        "clip_ratio.png",
        "policy.png",
        "idle.png",
        "queue.png",
        "throughput.png",
        "timing.png",
        "summary.md",
    }
    for p in files:
        assert p.parent == run / "plots"
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 5_000


def test_panels_without_data_are_skipped(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [{"step": 1, "time": 1.0, "critic/score/mean": 0.5}])
    names = {p.name for p in plot_run(run, tmp_path / "out")}
    assert names == {"overview.png", "reward.png", "summary.md"}


def test_summary_numbers(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", records())
    rows = {r[0]: r[1:] for r in metric_table(records())}
    # val/mean: first 0 (step 0), final 0.4 (step 4), best 0.4 at step 4
    assert rows["val/mean"] == ("0", "0.4", "0.4", "4")
    # critic/score/mean 0.1, 0.3, 0.2, 0.5: first 0.1, final 0.5, best 0.5 at step 4
    assert rows["critic/score/mean"] == ("0.1", "0.5", "0.5", "4")
    # idle ratio 0.08, 0.07, 0.06, 0.05: lower is better, best 0.05 at step 4
    assert rows["trainer/idle_ratio"] == ("0.08", "0.05", "0.05", "4")
    assert rows["response_length/mean"][2:] == ("-", "-")  # no "best" length
    timing, mean_step = timing_table(records())
    # steps take 51, 52, 53, 54 s: mean 52.5; gen 30 s x 4 = 120 s of 210 s = 57.1%
    assert mean_step == pytest.approx(52.5)
    assert timing[0] == ("gen", "30", "120", "57.1%")
    text = summarize_run(run, images=[Path("overview.png")])
    assert "# Run summary: dapo_math" in text
    assert "| policy loss | ppo_clip (clip_ratio_low=0.2, clip_ratio_high=0.28) |" in text
    assert "| reward | dapo (overlong_buffer_len=4096, penalty_factor=1) + dapo_math |" in text
    assert "| placement | ray, trainer 1x4 GPU + rollout 1x4 GPU |" in text
    assert "| runner | fully_async |" in text
    assert "| validation | n=32, temperature=1.0, every 2 steps, before training |" in text
    # plugins: third-party ones always; built-ins only when a part of the run came from them
    assert "| my_async_plugin | 1.2.3 | my-async | loaded |" in text
    assert "rlzoo.algorithms.advantage" in text and "rlzoo.backends.vllm" not in text
    assert "wall-clock (first to last record): 4 min 00 s" in text
    assert "![overview](overview.png)" in text


def test_cli_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rlzoo.cli import main

    run = write_run(tmp_path / "run", records())
    assert main(["plot", str(run)]) == 0
    out = capsys.readouterr().out.split()
    assert str(run / "plots" / "overview.png") in out and str(run / "plots" / "summary.md") in out


def test_not_a_run_dir(tmp_path: Path) -> None:
    with pytest.raises(RlzooError, match=r"metrics.jsonl not found \(is it a run directory"):
        plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(RlzooError, match="no records yet"):
        plot_run(tmp_path)


def test_missing_matplotlib_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = write_run(tmp_path / "run", records())
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(RlzooError, match=r"pip install rlzoo\[plot\]"):
        plot_run(run)


# ---------------------------------------------------------------------------------------------
# plots a person reads: smoothing, no hidden series, legends outside, long async runs, overlays
# ---------------------------------------------------------------------------------------------
def long_async_records(steps: int = 1000, seed: int = 0) -> list[dict[str, Any]]:
    """A noisy 1000-step fully-async run: score == acc at every step, idle ratios with spikes."""
    import random

    rng = random.Random(seed)
    out = []
    for s in range(1, steps + 1):
        score = 0.2 + 0.5 * (1 - 0.997**s) + rng.gauss(0, 0.08)
        out.append(
            {
                "step": s,
                "time": 1000.0 + 36 * s,
                "critic/score/mean": score,
                "critic/acc/mean": score,
                "trainer/idle_ratio": min(1.0, max(0.0, 0.07 + rng.gauss(0, 0.04))),
                "queue/size": 64 + rng.gauss(0, 20),
                "staleness/max": float(rng.choice([0, 1, 1, 2])),
            }
        )
    return out


def panel(name: str) -> Any:
    return next(p for p in PANELS if p.name == name)


def draw(name: str, runs: list[RunData], smooth: float | None = None) -> Any:
    from rlzoo.report import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.6), layout="constrained")
    assert _draw(ax, panel(name), runs, smooth)
    fig.canvas.draw()
    return ax


def test_ema_and_rolling_mean_by_hand() -> None:
    # debiased EMA with weight 0.5 of 1, 0, 0: 0.5 / 0.5 = 1; 0.25 / 0.75 = 1/3; 0.125 / 0.875 = 1/7
    assert ema([1.0, 0.0, 0.0], 0.5) == pytest.approx([1.0, 1 / 3, 1 / 7])
    assert ema([3.0, 5.0], 0.0) == [3.0, 5.0]
    # trailing mean over 2: 1, (1+2)/2, (2+3)/2, (3+4)/2
    assert rolling_mean([1.0, 2.0, 3.0, 4.0], 2) == pytest.approx([1.0, 1.5, 2.5, 3.5])
    with pytest.raises(RlzooError, match=r"\[0, 1\)"):
        ema([1.0], 1.0)


def test_long_series_are_smoothed_over_their_faint_raw_values() -> None:
    recs = long_async_records()
    ax = draw("reward", [RunData("a", recs)], smooth=0.9)
    _, raw = series(recs, "critic/score/mean")
    lines = ax.get_lines()
    faint = [ln for ln in lines if (ln.get_alpha() or 1.0) < 0.5]
    solid = [ln for ln in lines if (ln.get_alpha() or 1.0) == 1.0]
    assert any(list(ln.get_ydata()) == raw for ln in faint)  # the raw values, faint
    assert any(list(ln.get_ydata()) == pytest.approx(ema(raw, 0.9)) for ln in solid)  # the EMA on top


def test_an_equal_series_is_not_hidden_under_another() -> None:
    ax = draw("reward", [RunData("a", long_async_records())])
    legend = ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert "critic/acc/mean (= critic/score/mean)" in labels
    solid = [ln for ln in ax.get_lines() if (ln.get_alpha() or 1.0) == 1.0]
    score, acc = solid[0], solid[1]
    assert list(score.get_ydata()) == list(acc.get_ydata())  # equal data...
    assert score.get_linestyle() != acc.get_linestyle()  # ...drawn differently
    assert score.get_marker() != acc.get_marker()
    assert score.get_markevery() != acc.get_markevery()  # markers at different steps


def test_legends_sit_outside_the_data() -> None:
    for name in ("reward", "idle", "queue", "staleness"):
        ax = draw(name, [RunData("a", long_async_records())])
        legend = ax.get_legend().get_window_extent()
        plot_area = ax.get_window_extent()
        assert legend.y1 <= plot_area.y0, name  # entirely below the plot area


def test_idle_ratio_is_a_rolling_mean_and_staleness_a_histogram(tmp_path: Path) -> None:
    recs = long_async_records()
    _, idle = series(recs, "trainer/idle_ratio")
    ax = draw("idle", [RunData("a", recs)])
    window = max(5, len(idle) // 40)  # 25 steps for 1000
    assert any(list(ln.get_ydata()) == pytest.approx(rolling_mean(idle, window)) for ln in ax.get_lines())
    assert ax.get_ylim() == pytest.approx((-0.02, 1.02))
    # per-sample staleness counts from an async run's summary.json: 80 / 15 / 5 samples
    run = tmp_path / "async"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"staleness_histogram": {"0": 80, "1": 15, "2": 5}}))
    ax = draw("staleness", [RunData("a", recs, run)])
    heights = sorted((round(p.get_x() + p.get_width() / 2), p.get_height()) for p in ax.patches)
    assert heights == [(0, pytest.approx(0.8)), (1, pytest.approx(0.15)), (2, pytest.approx(0.05))]


def test_several_runs_are_overlaid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rlzoo.cli import main

    a = write_run(tmp_path / "sync", long_async_records(200, seed=1))
    b = write_run(tmp_path / "async", long_async_records(200, seed=2))
    files = plot_runs([a, b])
    assert files[0] == a / "plots" / "compare" / "overview.png"
    assert (a / "plots" / "compare" / "summary.md").read_text().count("## ") >= 3  # both runs + curves
    ax = draw("reward", [RunData("sync", series_records(a)), RunData("async", series_records(b))])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "sync: critic/score/mean" in labels and "async: critic/score/mean" in labels
    colors = {ln.get_color() for ln in ax.get_lines() if (ln.get_alpha() or 1.0) == 1.0}
    assert len(colors) == 2  # one colour per run
    assert main(["plot", str(a), str(b), "--out", str(tmp_path / "cmp"), "--smooth", "0.8"]) == 0
    assert str(tmp_path / "cmp" / "reward.png") in capsys.readouterr().out.split()


def series_records(run_dir: Path) -> list[dict[str, Any]]:
    from rlzoo.report.metrics import read_metrics

    return read_metrics(run_dir)


def test_summary_shows_the_learning_rate_from_trainer_optim() -> None:
    """The learning rate lives in ``trainer.optim`` (it moved out of the backend's params): the
    summary's highlights read it from there (they read ``trainer.backend.lr`` and never showed it)."""
    from rlzoo.report.summary import config_highlights

    cfg = {
        "trainer": {
            "backend": {"name": "native", "dtype": "float32"},
            "optim": {"lr": 3e-3, "lr_scheduler": "cosine", "warmup_steps": 5},
        }
    }
    rows = dict(config_highlights(cfg))
    assert rows["optimizer"] == "lr=0.003, lr_scheduler=cosine, warmup_steps=5"
    assert "lr" not in rows["train backend"]


def test_runs_drawn_together_are_smoothed_by_one_window() -> None:
    """Before: each run was smoothed by its own length, so a run and its first 60 steps (identical
    data) got EMA 0.83 and 0.95 and their curves looked ~30 steps apart (issue 23)."""
    long = long_async_records(1000, seed=3)
    short = long[:60]
    ax = draw("reward", [RunData("long", long), RunData("short", short)])
    solid = [ln for ln in ax.get_lines() if (ln.get_alpha() or 1.0) == 1.0]
    by_len = {len(ln.get_ydata()): list(ln.get_ydata()) for ln in solid}
    _, raw = series(long, "critic/score/mean")
    weight = min(0.95, 1.0 - 10.0 / 1000)  # the longest run's window: 1 - 10 / n, at most 0.95
    assert by_len[60] == pytest.approx(ema(raw[:60], weight))
    assert by_len[60] == pytest.approx(by_len[1000][:60])  # equal data, equal curve


def test_summary_md_lists_the_runs_failures(tmp_path: Path) -> None:
    # issue 39: summary.json's failures (rlzoo.train.failures.RewardFailures.summary) in summary.md
    run = tmp_path / "run"
    run.mkdir()
    failures = {
        "trained_samples": 32,
        "failed_samples": 5,
        "failed_tool_calls": 0,
        "by_part": {"scorer math": 5},
        "errors": [
            {"part": "scorer math", "message": "ValueError: bad", "count": 5, "first_step": 2, "last_step": 3}
        ],
        "tracebacks": str(run / "failures.jsonl"),
    }
    (run / "summary.json").write_text(json.dumps({"steps": 3, "failures": failures}))
    text = summarize_run(run, records=[])
    assert "## Failures" in text and "5 of 32 trained samples failed" in text
    assert "| scorer math | 5 | 2-3 | ValueError: bad |" in text
