"""``rlzoo view`` in a real browser (Debian's Chromium driven by Playwright) against real run
directories the test makes: a multi-turn ``quickstart_tools`` run and a ``fully_async`` quickstart
run. The curves render (both runs overlaid), a trajectory opens with the model's and the
environment's tokens told apart, token colours follow the data, search and filters select the
right samples, the page follows a run that is still writing, and ``--html`` works without a server.

``RLZOO_SCREENSHOTS=1`` also writes docs/images/view_curves.png and view_trajectory.png.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from run_fixtures import QUIET

import rlzoo
from rlzoo.cli import main
from rlzoo.report.metrics import read_metrics
from rlzoo.report.samples import read_samples, sample_steps, step_file

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
pytestmark = pytest.mark.slow  # two short training runs and a browser: ~45 s

DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
STEPS = 3


@pytest.fixture(scope="module")
def runs(quickstart_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("viewruns")
    tools, fully_async = root / "tools", root / "fully_async"
    common = [*QUIET, f"trainer.total_steps={STEPS}", "trainer.save_freq=-1", "trainer.test_freq=-1"]
    rlzoo.build_run(
        "quickstart_tools",
        [
            f"data.dir={root / 'tools_data'}",
            f"run.output_dir={tools}",
            *common,
            "data.train_batch_size=8",
            "trainer.ppo_mini_batch_size=8",
            "trainer.val_before_train=true",
        ],
    ).train()
    rlzoo.build_run(
        "quickstart",
        [
            f"data.dir={quickstart_dir}",
            f"run.output_dir={fully_async}",
            *common,
            "data.train_batch_size=4",
            "trainer.ppo_mini_batch_size=4",
            "~runner",
            "+runner={name:fully_async,trigger_parameter_sync_step:1,staleness_threshold:1.0,require_batches:1}",
        ],
    ).train()
    return {"tools": tools, "fully_async": fully_async}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the browser test needs playwright (dev extra)"
    )
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian's chromium package; .ci/run installs it)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        yield b
        b.close()


def _open(browser: Any, url: str) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 820})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    page.errors = errors
    return page


def _colour_logprob(v: float) -> str:
    # the page's scale: 0 white, -5 and below rgb(255, 55, 55), linear between
    c = round(255 - 200 * min(1.0, max(0.0, -v / 5)))
    return f"rgb(255, {c}, {c})"


def _shot(page: Any, name: str, tmp_path: Path) -> None:
    folder = DOCS_IMAGES if os.environ.get("RLZOO_SCREENSHOTS") == "1" else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / name))


def test_curves_trajectories_colours_and_search(browser: Any, runs: dict[str, Path], tmp_path: Path) -> None:
    from rlzoo.report.view import serve_in_thread

    server, url = serve_in_thread([runs["tools"], runs["fully_async"]])
    try:
        page = _open(browser, url)
        # -- the curves: one line per run, one point per logged step
        chart = page.locator('.chart[data-key="critic/score/mean"]')
        assert chart.locator("polyline.series").count() == 2
        for i, run in enumerate((runs["tools"], runs["fully_async"])):
            steps = [r["step"] for r in read_metrics(run) if isinstance(r.get("critic/score/mean"), float)]
            points = chart.locator(f'polyline[data-run="{i}"]').get_attribute("points")
            assert len(points.split()) == len(steps) == STEPS
        _shot(page, "view_curves.png", tmp_path)

        # -- a multi-turn trajectory: the tool's tokens are the environment's
        rows = read_samples(runs["tools"], STEPS)
        mixed = next(r for r in rows if 0 in r["model_mask"] and 1 in r["model_mask"])
        page.locator(f'#sample-table tr[data-uid="{mixed["uid"]}"]').click()
        assert page.locator("#traj").is_visible()
        assert page.locator("#tokens .tok.model").count() == sum(mixed["model_mask"])
        assert page.locator("#tokens .tok.env").count() == mixed["model_mask"].count(0)
        env_text = "".join(t for t, m in zip(mixed["tokens"], mixed["model_mask"]) if m == 0)
        assert "".join(page.locator("#tokens .tok.env").all_inner_texts()) == env_text

        # -- colour by log-prob: each model token's colour is its own log-prob's
        page.select_option("#colorby", "logprobs")
        spans = page.locator("#tokens .tok.model")
        model_lps = [lp for lp, m in zip(mixed["logprobs"], mixed["model_mask"]) if m]
        for j in range(spans.count()):
            v = float(spans.nth(j).get_attribute("data-v"))
            assert v == pytest.approx(model_lps[j], abs=1e-5)
            bg = spans.nth(j).evaluate("e => getComputedStyle(e).backgroundColor")
            assert bg == _colour_logprob(v), (j, v, bg)
        # environment tokens are not coloured (not trained, no log-prob of the policy)
        assert page.locator("#tokens .tok.env[data-v]").count() == 0
        # by advantage: the sign shows (green above 0, red below)
        page.select_option("#colorby", "advantages")
        for j in range(spans.count()):
            v = float(spans.nth(j).get_attribute("data-v"))
            r, g, _ = (
                int(x)
                for x in spans.nth(j).evaluate("e => getComputedStyle(e).backgroundColor")[4:-1].split(",")
            )
            assert (g == 255 and r <= 255) if v >= 0 else (r == 255 and g < 255)
        _shot(page, "view_trajectory.png", tmp_path)

        # -- search and filters select exactly the matching samples
        word = "calc"
        expect = sum(1 for r in rows if word in r["prompt"].lower() or word in r["response"].lower())
        page.fill("#search", word)
        assert page.locator("#sample-table tbody tr").count() == expect
        assert 0 < expect < len(rows), "pick a search word that selects some samples, not all"
        page.fill("#search", "")
        page.select_option("#trunc", "yes")
        assert page.locator("#sample-table tbody tr").count() == sum(1 for r in rows if r["truncated"])
        page.select_option("#trunc", "")
        page.fill("#lmin", "5")
        assert page.locator("#sample-table tbody tr").count() == sum(
            1 for r in rows if r["response_length"] >= 5
        )
        page.fill("#lmin", "")

        # -- the fully-async run's samples carry the policy version of every token
        first = read_samples(runs["fully_async"], STEPS)[0]
        page.select_option("#run", "1")
        page.wait_for_selector(
            f"body[data-shown='1:train:{STEPS}']"
        )  # its samples arrived, not only its steps
        page.locator("#sample-table tbody tr").first.click()
        page.select_option("#colorby", "versions")
        versions = [
            float(v)
            for v in page.locator("#tokens .tok.model").evaluate_all("es => es.map(e => e.dataset.v)")
        ]
        assert versions == [float(v) for v, m in zip(first["versions"], first["model_mask"]) if m]

        # -- validation samples (the tools run validated before training and at the end)
        page.select_option("#run", "0")
        page.select_option("#split", "val")
        page.wait_for_selector("body[data-shown^='0:val:']")
        steps = page.locator("#step option").evaluate_all("os => os.map(o => +o.value)")
        assert steps == sample_steps(runs["tools"], "val") and steps
        assert page.errors == []
    finally:
        server.shutdown()


def test_follows_a_run_that_is_still_writing(browser: Any, runs: dict[str, Path], tmp_path: Path) -> None:
    from rlzoo.report.view import serve_in_thread

    live = tmp_path / "live"
    shutil.copytree(runs["fully_async"], live)
    lines = (live / "metrics.jsonl").read_text().splitlines(keepends=True)
    (live / "metrics.jsonl").write_text("".join(lines[:-1]))  # the last step not written yet
    last = step_file(live, STEPS)
    held = last.read_bytes()
    last.unlink()
    server, url = serve_in_thread([live])
    try:
        page = _open(browser, url)
        poly = page.locator('.chart[data-key="critic/score/mean"] polyline')
        assert len(poly.get_attribute("points").split()) == STEPS - 1
        assert page.locator("#step").input_value() == str(STEPS - 1)
        (live / "metrics.jsonl").write_text("".join(lines))
        last.write_bytes(held)
        page.wait_for_function(
            "document.querySelector('.chart[data-key=\"critic/score/mean\"] polyline')"
            f".getAttribute('points').split(' ').length == {STEPS}",
            timeout=15_000,
        )
        page.wait_for_function(f"document.querySelector('#step').value == '{STEPS}'", timeout=15_000)
    finally:
        server.shutdown()


def test_html_file_needs_no_server(browser: Any, runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "view.html"
    assert main(["view", str(runs["tools"]), str(runs["fully_async"]), "--html", str(out)]) == 0
    page = _open(browser, out.as_uri())
    assert page.locator('.chart[data-key="critic/score/mean"] polyline.series').count() == 2
    assert page.locator("#sample-table tbody tr").count() == len(read_samples(runs["tools"], STEPS))
    assert page.errors == []


def test_not_a_run_directory_is_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert main(["view", str(tmp_path / "nowhere"), "--html", str(tmp_path / "x.html")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()
