"""The remote option speaks SandboxFusion's /run_code: same API, same outcomes as the local sandbox."""

from __future__ import annotations

import pytest

from rlzoo.sandbox import sandbox_for
from rlzoo.sandbox.params import SandboxParams
from rlzoo.sandbox.remote import RemoteSandbox, RemoteSandboxError
from rlzoo.sandbox.run import Outcome, Sandbox

from .fusion_standin import fusion_standin

LOCAL = SandboxParams(timeout_s=2.0, memory_mb=256, require=())


def test_the_remote_sandbox_gives_what_the_local_one_gives() -> None:
    with fusion_standin(LOCAL) as url:
        remote = sandbox_for(SandboxParams(url=url, timeout_s=2.0))
        assert isinstance(remote, RemoteSandbox)
        ex = remote.run(
            "import sys; print(sys.stdin.read(), open('t/a.txt').read())",
            stdin="in",
            files={"t/a.txt": "file"},
        )
        assert ex.outcome is Outcome.OK and ex.stdout == "in file\n"
        assert remote.run("raise ValueError('x')").outcome is Outcome.ERROR
        assert remote.run("while True: pass", timeout_s=1.0).outcome is Outcome.TIMEOUT
        assert [e.stdout for e in remote.map([{"code": f"print({i})"} for i in range(3)])] == [
            "0\n",
            "1\n",
            "2\n",
        ]
        remote.close()


def test_an_unreachable_server_is_an_error_not_a_wrong_answer() -> None:
    remote = RemoteSandbox(SandboxParams(url="http://127.0.0.1:9", timeout_s=1.0))
    with pytest.raises(RemoteSandboxError, match=r"127\.0\.0\.1:9"):
        remote.run("print(1)")


def test_sandbox_for_shares_one_sandbox_per_settings() -> None:
    a, b = sandbox_for(LOCAL), sandbox_for(SandboxParams(timeout_s=2.0, memory_mb=256, require=()))
    assert a is b and isinstance(a, Sandbox)
    assert sandbox_for(SandboxParams(timeout_s=3.0, require=())) is not a
