"""The sandbox's API: one run, its inputs and outputs, the bounded pool, refusals before running."""

from __future__ import annotations

import asyncio
import subprocess
import time
from typing import Any

import pytest

from rlzoo.sandbox.params import SandboxParams
from rlzoo.sandbox.probe import PROTECTIONS, protections
from rlzoo.sandbox.run import Outcome, Sandbox, SandboxUnavailable

FAST = {"timeout_s": 3.0, "memory_mb": 256, "require": ()}


@pytest.fixture(scope="module")
def box() -> Sandbox:
    return Sandbox(SandboxParams(max_parallel=2, **FAST))  # type: ignore[arg-type]


def test_protections_name_every_protection_and_say_why() -> None:
    found = protections("auto")
    assert set(found.active) == set(PROTECTIONS) and set(found.why) == set(PROTECTIONS)
    assert found.line().startswith(f"sandbox[{found.mode}]: ")
    assert not found.active["seccomp"] and "not used" in found.why["seccomp"]
    assert isinstance(found.unprivileged_bwrap, bool)
    assert protections("rlimits").mode == "rlimits" and not protections("rlimits").active["no_network"]


def test_stdin_files_and_argv(box: Sandbox) -> None:
    ex = box.run(
        "import sys; print(sys.stdin.read().upper(), open('data/in.txt').read())",
        stdin="abc",
        files={"data/in.txt": "xyz"},
    )
    assert ex.outcome is Outcome.OK and ex.stdout == "ABC xyz\n" and ex.returncode == 0
    ex = box.run(argv=["/bin/cat", "a.txt"], files={"a.txt": b"raw bytes"})
    assert ex.ok and ex.stdout == "raw bytes"
    ex = box.run("import sys; sys.stderr.write('boom'); sys.exit(3)")
    assert ex.outcome is Outcome.ERROR and ex.returncode == 3 and ex.stderr == "boom"


def test_each_execution_gets_a_fresh_directory(box: Sandbox) -> None:
    first = box.run("import os; open('left.txt', 'w').write('x'); print(sorted(os.listdir('.')))")
    second = box.run("import os; print(sorted(os.listdir('.')))")
    assert "left.txt" in first.stdout and "left.txt" not in second.stdout, (first, second)


@pytest.mark.parametrize("name", ["/etc/passwd", "../up.txt", "a/../../b", ""])
def test_file_names_stay_inside(box: Sandbox, name: str) -> None:
    with pytest.raises(ValueError, match="plain relative paths"):
        box.run("pass", files={name: "x"})


def test_code_or_argv_not_both(box: Sandbox) -> None:
    with pytest.raises(ValueError, match="one of them"):
        box.run("pass", argv=["/bin/true"])


def test_a_missing_protection_is_refused_before_anything_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_popen(*a: Any, **k: Any) -> None:
        raise AssertionError("nothing may run")

    found = protections("rlimits")
    monkeypatch.setattr(subprocess, "Popen", no_popen)
    with pytest.raises(SandboxUnavailable, match=r"requires \['no_network'\].*sandbox.require"):
        Sandbox(SandboxParams(isolation="rlimits", require=("no_network",)))
    with pytest.raises(SandboxUnavailable, match="seccomp"):
        Sandbox(SandboxParams(require=("seccomp",)))
    assert not found.active["no_network"]


def test_params_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="unknown protections"):
        SandboxParams(require=("network",))
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        SandboxParams(timeout_s=0)


def test_the_pool_is_bounded_and_keeps_order() -> None:
    box = Sandbox(SandboxParams(max_parallel=2, **FAST))  # type: ignore[arg-type]
    start = time.monotonic()
    done = box.map([{"code": f"import time; time.sleep(0.4); print({i})"} for i in range(4)])
    took = time.monotonic() - start
    box.close()
    assert [d.stdout for d in done] == [f"{i}\n" for i in range(4)]
    assert took >= 0.8  # 4 sleeps of 0.4 s through 2 slots: at least two rounds


def test_arun_never_blocks_the_event_loop(box: Sandbox) -> None:
    async def main() -> tuple[int, str]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        ex = await box.arun("import time; time.sleep(0.5); print('done')")
        ticker.cancel()
        return ticks, ex.stdout

    ticks, out = asyncio.run(main())
    assert out == "done\n" and ticks >= 10  # the loop ran on while the code slept 0.5 s


def test_validate_reports_a_missing_protection_before_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    from rlzoo.cli import main

    # rlimits mode has no pid namespace, which the default require names: refused at validate time
    assert main(["validate", "quickstart_code", "reward.scorer.sandbox.isolation=rlimits"]) != 0
    out = capsys.readouterr()
    assert (
        "reward.scorer: the sandbox requires ['pid_namespace', 'no_network', 'private_fs']"
        in out.out + out.err
    )
    assert (
        main(
            [
                "validate",
                "quickstart_code",
                "reward.scorer.sandbox.isolation=rlimits",
                "reward.scorer.sandbox.require=[]",
            ]
        )
        == 0
    )


def test_sandboxes_never_share_a_uid_and_leave_no_folder(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    a = Sandbox(SandboxParams(max_parallel=2, **FAST))  # type: ignore[arg-type]
    b = Sandbox(SandboxParams(max_parallel=3, **FAST))  # type: ignore[arg-type]
    if a.protections.root:
        assert len(set(a.uids) | set(b.uids)) == 5 and max(a.uids + b.uids) <= 65534
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert (
        a.run("open('x', 'w').write('y')").ok
        and b.run("while True: pass", timeout_s=0.5).outcome is Outcome.TIMEOUT
    )
    assert list(tmp_path.iterdir()) == []  # its work folders and stdin files are gone
