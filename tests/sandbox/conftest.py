"""The attack table: which attack this machine's sandbox stops, and by which protection
(tests/sandbox/test_attacks.py fills it in; printed at the end of the session)."""

from __future__ import annotations

from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from sandbox.test_attacks import ATTACKS, RESULTS

    if not RESULTS:
        return
    modes = sorted({mode for mode, _ in RESULTS})
    terminalreporter.section("sandbox attack table")
    for name in ATTACKS:
        cells = [f"{mode}: {RESULTS.get((mode, name), 'not run')}" for mode in modes]
        terminalreporter.write_line(f"{name:32s} | " + " | ".join(cells))
