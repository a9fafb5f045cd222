"""Conformance suite of the ``logger`` kind."""

from __future__ import annotations

from typing import Any

from rlzoo.testing.conformance.base import ComponentConformance


# ---------------------------------------------------------------------------------------------
# logger
# ---------------------------------------------------------------------------------------------
class LoggerConformance(ComponentConformance):
    """``factory(params, LoggerContext) -> MetricSink``: takes every record, then closes.

    Each test builds the logger on a fresh run directory (``tmp_path``). Override :meth:`context`
    for a logger that needs more (a tracker in offline mode, a server URI in ``params_overrides``).
    """

    kind = "logger"

    def context(self, run_dir: Any) -> Any:
        from rlzoo.report.metrics import LoggerContext

        return LoggerContext(run_dir=run_dir, run_name="conformance", run_id=run_dir.name, progress=False)

    def records(self) -> list[dict[str, Any]]:
        """What a run sends: validation at step 0 (not a training step), floats, a null, a string."""
        return [
            {"step": 0, "time": 1000.0, "val/mean": 0.25},
            {"step": 1, "time": 1001.0, "critic/score/mean": 0.5, "actor/entropy": None, "note": "text"},
            {"step": 2, "time": 1002.0, "critic/score/mean": 0.75, "val/default/mean@4": 1.0},
        ]

    def test_takes_every_record_and_closes(self, tmp_path: Any) -> None:
        from rlzoo.report.metrics import MetricSink

        sink = self.make_part()(self.params, self.context(tmp_path))
        assert isinstance(sink, MetricSink), f"{self.name}: the factory must return a MetricSink (log, close)"
        for r in self.records():
            sink.log(int(r["step"]), r, advance=r["step"] > 0)
        sink.close()
