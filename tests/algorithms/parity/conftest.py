"""Prints the parity coverage table (part -> quantity -> max |rlzoo - verl|) after the run."""

from __future__ import annotations


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    import sys

    mod = sys.modules.get("parity._verl") or sys.modules.get("tests.parity._verl")
    if mod is None or not mod.RECORD.rows:
        return
    terminalreporter.section("parity with verl 0.9.1: max |rlzoo - verl|")
    for (part, quantity), diff in sorted(mod.RECORD.rows.items()):
        terminalreporter.write_line(f"{part:<40} {quantity:<44} {diff:.2e}")
