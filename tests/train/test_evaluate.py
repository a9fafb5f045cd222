"""``rlzoo eval`` (:mod:`rlzoo.train.evaluate`) on a tiny quickstart run's first (the base model,
``@0``) and last checkpoint: the numbers follow from the per-prompt results by the published
formulas, a kill mid-way loses and repeats nothing, failures are messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_fixtures import QUIET

import rlzoo
from rlzoo.cli import main
from rlzoo.report.passk import pass_at_k
from rlzoo.train.evaluate import RESULTS, EvalSettings, evaluate, read_results

N, LIMIT = 3, 6


@pytest.fixture(scope="module")
def run_dir(quickstart_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("evalrun") / "run"
    rlzoo.build_run(
        "quickstart",
        [
            f"data.dir={quickstart_dir}",
            f"run.output_dir={out}",
            *QUIET,
            "trainer.total_steps=2",
            "trainer.save_freq=1",
        ],
    ).train()
    return out


def _settings(**kw: object) -> EvalSettings:
    base = {"n": N, "temperature": 1.0, "seed": 0, "threshold": 1.0, "limit": LIMIT, "batch": 4}
    return EvalSettings(**{**base, "bootstrap": 200, "level": 0.9, **kw})  # type: ignore[arg-type]


def test_first_and_last_checkpoint_compared(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    specs = [f"{run_dir}@0", f"{run_dir}@latest"]
    summary = evaluate(specs, _settings(), out=out, progress=False)
    assert summary["prompts"] == LIMIT
    assert [t["step"] for t in summary["targets"]] == [0, 2]
    rows = read_results(out)
    assert sorted((r["target"], r["index"]) for r in rows) == sorted(
        (s, i) for s in specs for i in range(LIMIT)
    )
    for spec in specs:
        mine = [r for r in rows if r["target"] == spec]
        assert all(len(r["responses"]) == N for r in mine)
        # pass@k: the mean over prompts of 1 - C(n-c,k)/C(n,k), from the per-prompt counts
        for k in range(1, N + 1):
            expect = sum(pass_at_k(N, sum(r["correct"]), k) for r in mine) / LIMIT
            assert summary["metrics"][spec][f"pass@{k}"]["value"] == pytest.approx(expect)
        avg = sum(sum(r["acc"]) / N for r in mine) / LIMIT
        assert summary["metrics"][spec][f"avg@{N}"]["value"] == pytest.approx(avg)
        e = summary["metrics"][spec]["pass@1"]
        assert e["low"] <= e["value"] <= e["high"]
    d = summary["difference"]["pass@1"]
    a, b = (summary["metrics"][s]["pass@1"]["value"] for s in specs)
    assert d["value"] == pytest.approx(b - a) and d["low"] <= d["value"] <= d["high"]
    assert (out / "results.parquet").is_file() and "pass@3" in (out / "report.md").read_text()
    # @latest is step 2, whose weights final/ holds: no export needed; @0 is the model the run started from
    assert summary["targets"][1]["model"] == str(run_dir / "final")


def test_a_checkpoint_without_an_export_is_exported_once(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    evaluate([f"{run_dir}@1"], _settings(limit=2, n=1), out=out, progress=False)
    folder = out / "models" / "run-step_1"
    assert json.loads((folder / "rlzoo_export.json").read_text())["step"] == 1
    stamp = (folder / "rlzoo_export.json").stat().st_mtime_ns
    evaluate([f"{run_dir}@1"], _settings(limit=2, n=1), out=out, progress=False)  # done: nothing redone
    assert (folder / "rlzoo_export.json").stat().st_mtime_ns == stamp


def test_a_killed_evaluation_continues_without_losing_or_repeating(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    spec = f"{run_dir}@latest"
    evaluate([spec], _settings(), out=out, progress=False)
    full = {r["index"]: r for r in read_results(out)}
    # as a kill leaves it: the last two prompts missing, the one before cut mid-line
    lines = (out / RESULTS).read_text().splitlines(keepends=True)
    (out / RESULTS).write_text("".join(lines[:-3]) + lines[-3][: len(lines[-3]) // 2])
    evaluate([spec], _settings(), out=out, progress=False)
    again = read_results(out)
    assert sorted(r["index"] for r in again) == list(range(LIMIT))  # each prompt once
    # the prompts evaluated again drew the same samples (each prompt's seed is its own)
    assert {r["index"]: r["responses"] for r in again} == {i: r["responses"] for i, r in full.items()}
    # other settings in the same folder: refused, nothing appended
    with pytest.raises(rlzoo.RlzooError, match="other settings"):
        evaluate([spec], _settings(n=2), out=out, progress=False)


def test_failures_are_messages(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["eval", f"{run_dir}@7", "--out", str(tmp_path / "e1")]) == 2
    assert "no checkpoint of step 7" in capsys.readouterr().err
    assert main(["eval", str(run_dir / "final"), str(run_dir / "final"), "--out", str(tmp_path / "e2")]) == 2
    assert "the same" in capsys.readouterr().err
    assert main(["eval", str(run_dir), "--n", "0"]) == 2
    assert "--n 0" in capsys.readouterr().err
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert main(["eval", str(run_dir), "--out", str(mine)]) == 2
    assert "not an empty folder" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]  # nothing written into a user's folder
    model = tmp_path / "model"
    (model).mkdir()
    (model / "config.json").write_text("{}")
    assert main(["eval", str(model)]) == 2
    assert "--recipe" in capsys.readouterr().err


def test_a_run_folder_whose_name_the_override_grammar_cannot_read(run_dir: Path, tmp_path: Path) -> None:
    # the model folder is set as a value, not as a `model.path=...` line: a folder named with '(', '~',
    # '=' or a non-ASCII letter is evaluated (an override line holding it is refused as unreadable)
    import shutil

    odd = tmp_path / "runs (1) ü~a=b"
    shutil.copytree(run_dir, odd)
    summary = evaluate([f"{odd}@latest"], _settings(limit=2, n=1), out=tmp_path / "eval", progress=False)
    assert summary["targets"][0]["model"] == str(odd / "final")
