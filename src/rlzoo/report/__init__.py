"""Reports of a run directory: learning curves as PNG and a Markdown summary (``rlzoo plot RUN_DIR``).

:func:`plot_run` reads what every runner writes into its run directory (``metrics.jsonl``,
``config.yaml``, ``plugins.json``) and writes, under ``RUN_DIR/plots/``:

- one PNG per panel whose metrics exist (reward and accuracy, validation accuracy per data source,
  response length and clip ratio, policy statistics, idle ratios and queue, throughput, time per
  phase), and ``overview.png`` with every panel on one page;
- ``summary.md``: config highlights, plugins, first / final / best value of the key metrics, the
  timing breakdown per phase, and the PNGs.

Panels are chosen by metric *names* (verl's, which :mod:`rlzoo.report.metrics` keeps), never by runner:
a panel without any of its keys in the file is skipped, so a sync run simply has no idle-ratio
panel. matplotlib is imported lazily with the Agg backend (no display needed).

The package is split by concern: :mod:`rlzoo.report.panels` (which keys each chart draws),
:mod:`rlzoo.report.data` (series and smoothing), :mod:`rlzoo.report.plot` (drawing, the entry
points) and :mod:`rlzoo.report.summary` (``summary.md``); everything is re-exported here.
"""

from __future__ import annotations

from rlzoo.report.data import (
    MIN_POINTS_TO_SMOOTH,
    auto_smooth,
    ema,
    match,
    metric_keys,
    rolling_mean,
    rolling_window,
    series,
    smoothed,
)
from rlzoo.report.panels import PANELS, SUMMARY_KEYS, Panel, Records
from rlzoo.report.plot import MARKERS, STYLES, RunData, _draw, _pyplot, plot_run, plot_runs
from rlzoo.report.summary import config_highlights, metric_table, summarize_run, timing_table

__all__ = [
    "MARKERS",
    "MIN_POINTS_TO_SMOOTH",
    "PANELS",
    "STYLES",
    "SUMMARY_KEYS",
    "Panel",
    "Records",
    "RunData",
    "_draw",
    "_pyplot",
    "auto_smooth",
    "config_highlights",
    "ema",
    "match",
    "metric_keys",
    "metric_table",
    "plot_run",
    "plot_runs",
    "rolling_mean",
    "rolling_window",
    "series",
    "smoothed",
    "summarize_run",
    "timing_table",
]
