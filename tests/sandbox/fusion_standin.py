"""A local stand-in for a SandboxFusion server: ``POST /run_code`` in SandboxFusion's request and response
shape, run by rlzoo's local sandbox. For tests of the remote option only (used by tests/sandbox and
tests/algorithms); a real deployment runs SandboxFusion itself (docs/code.md)."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rlzoo.sandbox.params import SandboxParams
from rlzoo.sandbox.run import Outcome, Sandbox


def _answer(box: Sandbox, request: dict[str, Any]) -> dict[str, Any]:
    if request.get("language") != "python":
        return {"status": "SandboxError", "message": f"language {request.get('language')!r} not served here"}
    files = {name: base64.b64decode(data) for name, data in (request.get("files") or {}).items()}
    ex = box.run(
        request["code"],
        stdin=request.get("stdin") or "",
        files=files,
        timeout_s=float(request["run_timeout"]),
    )
    status = {Outcome.OK: "Finished", Outcome.TIMEOUT: "TimeLimitExceeded"}.get(ex.outcome, "Error")
    run_result = {
        "status": "Finished" if status == "Error" and ex.returncode is not None else status,
        "execution_time": ex.wall_s,
        "return_code": ex.returncode,
        "stdout": ex.stdout,
        "stderr": ex.stderr,
    }
    return {
        "status": "Success" if ex.ok else "Failed",
        "message": "",
        "compile_result": None,
        "run_result": run_result,
        "files": {},
    }


@contextmanager
def fusion_standin(params: SandboxParams) -> Iterator[str]:
    """Serve ``/run_code`` on a free loopback port; yields the base URL."""
    box = Sandbox(params)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path != "/run_code":
                self.send_error(404)
                return
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            body = json.dumps(_answer(box, request)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
        box.close()
