"""Every ``rlzoo SUBCOMMAND --help`` ends with an Examples section of real command lines."""

from __future__ import annotations

import argparse
import shlex
import tomllib
from pathlib import Path

import pytest

from rlzoo.cli import build_parser, main


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_help_shows_examples(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "\nExamples:\n" in text, f"rlzoo {name} --help has no Examples section"
    examples = [ln.strip() for ln in text.split("\nExamples:\n", 1)[1].splitlines() if ln.strip()]
    commands = [ln for ln in examples if ln.startswith("rlzoo ")]
    assert len(commands) >= 2, f"rlzoo {name} --help shows fewer than two examples"
    for cmd in commands:  # each example parses with the real parser (as written, comments dropped)
        argv = shlex.split(cmd.split("  #")[0])[1:]
        build_parser().parse_args(argv)


def test_examples_keep_their_line_breaks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plot", "--help"])
    text = capsys.readouterr().out
    assert "\n  rlzoo plot runs/sync-run runs/async-run --out plots/compare" in text


def test_version_is_the_packaged_one(capsys: pytest.CaptureFixture[str]) -> None:
    declared = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == declared["project"]["version"]
