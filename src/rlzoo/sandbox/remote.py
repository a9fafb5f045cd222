"""A SandboxFusion server as a sandbox: the same ``run`` / ``submit`` / ``map`` / ``arun`` as the local one.

Speaks SandboxFusion's ``POST {url}/run_code`` (request ``code``, ``language``, ``stdin``,
``run_timeout``, ``memory_limit_MB``, ``files`` as base64; response ``status`` and ``run_result``
with ``status``, ``return_code``, ``stdout``, ``stderr``, ``execution_time``). The server's own
isolation is what protects the machine it runs on; rlzoo does not probe it. A server that cannot
be reached or answers ``SandboxError`` is an error of the run (loud), never a wrong answer of the
code. Tested against a local stand-in that serves the same API over the local sandbox
(tests/sandbox/fusion_standin.py).
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from rlzoo.kernel.errors import RlzooError
from rlzoo.sandbox.params import SandboxParams
from rlzoo.sandbox.run import Execution, Outcome, Pooled

#: seconds the HTTP call may take beyond the code's own timeout (queueing, start-up on the server)
HTTP_SLACK_S = 30.0


class RemoteSandboxError(RlzooError):
    """The SandboxFusion server failed (unreachable, an HTTP error, ``SandboxError``): not the code's fault."""


class RemoteSandbox(Pooled):
    """Runs Python source on a SandboxFusion server at ``params.url``."""

    def __init__(self, params: SandboxParams) -> None:
        if not params.url:
            raise ValueError("RemoteSandbox needs SandboxParams.url (a SandboxFusion server's address)")
        self.params = params
        base = params.url.rstrip("/")  # verl's sandbox_fusion.url names the endpoint itself
        self.url = base if base.endswith("/run_code") else base + "/run_code"
        self.slots = params.max_parallel or 8
        self._thread_name = "rlzoo-fusion"

    def run(
        self,
        code: str | None = None,
        *,
        argv: Sequence[str] | None = None,
        stdin: str | bytes = b"",
        files: Mapping[str, str | bytes] | None = None,
        timeout_s: float | None = None,
    ) -> Execution:
        if argv is not None or code is None:
            raise ValueError("a SandboxFusion server runs source code (code=...), not a command")
        timeout = self.params.timeout_s if timeout_s is None else timeout_s
        request = {
            "code": code,
            "language": "python",
            "stdin": stdin.decode() if isinstance(stdin, bytes) else stdin,
            "compile_timeout": timeout,
            "run_timeout": timeout,
            "memory_limit_MB": self.params.memory_mb,
            "files": {
                name: base64.b64encode(v.encode() if isinstance(v, str) else v).decode()
                for name, v in (files or {}).items()
            },
            "fetch_files": [],
        }
        body = json.dumps(request).encode()
        http = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(http, timeout=timeout + HTTP_SLACK_S) as resp:
                answer = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise RemoteSandboxError(f"SandboxFusion server {self.url}: {exc}") from exc
        return self._execution(answer)

    def _execution(self, answer: Mapping[str, Any]) -> Execution:
        if answer.get("status") == "SandboxError":
            raise RemoteSandboxError(
                f"SandboxFusion server {self.url}: {answer.get('message', 'SandboxError')}"
            )
        result = answer.get("run_result") or answer.get("compile_result") or {}
        limit = self.params.max_output_bytes
        stdout, stderr = str(result.get("stdout") or ""), str(result.get("stderr") or "")
        rc = result.get("return_code")
        status = result.get("status")
        if status == "TimeLimitExceeded":
            outcome = Outcome.TIMEOUT
        elif rc == 0 and status == "Finished":
            outcome = Outcome.OK
        elif "MemoryError" in stderr[-2000:]:
            outcome = Outcome.MEMORY
        else:
            outcome = Outcome.ERROR
        return Execution(
            outcome=outcome,
            returncode=rc if isinstance(rc, int) else None,
            stdout=stdout[:limit],
            stderr=stderr[:limit],
            wall_s=float(result.get("execution_time") or 0.0),
            truncated=len(stdout) > limit or len(stderr) > limit,
        )
