"""``rlzoo view RUN [RUN ...]``: a run's curves, samples and trajectories in the browser.

A small HTTP server from Python's standard library (:mod:`http.server`) on the loopback address and a
free port serves one static page (:mod:`rlzoo.report.view_page`: HTML, CSS and its own JavaScript,
no framework, nothing fetched from the network) and a few JSON endpoints that read the run
directories as they are on disk; the page polls them, so it follows a run that is still training.
``--html FILE`` writes the same page with the data inside it: one file that opens anywhere.

Why no web framework: the viewer serves five GET endpoints to one local user; the standard
library does that with no new dependency, no build step, and nothing that could reach the network.

Endpoints (all GET, JSON): ``/api/runs``; ``/api/metrics?run=I``; ``/api/steps?run=I&split=train|val``;
``/api/samples?run=I&split=train|val&step=K``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from rlzoo.kernel.commands import CliCommand
from rlzoo.kernel.errors import RlzooError
from rlzoo.report.metrics import read_metrics
from rlzoo.report.samples import read_samples, sample_steps
from rlzoo.report.view_page import PAGE

SPLITS = ("train", "val")


def _clean(obj: Any) -> Any:
    """JSON the browser can parse: NaN and infinities become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


class RunData:
    """What the page shows of some run directories, read from disk on every call (a run that is
    still training shows its newest steps)."""

    def __init__(self, run_dirs: list[Path]) -> None:
        problems = []
        for d in run_dirs:
            if not d.is_dir():
                problems.append(f"{d}: no such folder")
            elif not (d / "metrics.jsonl").exists() and not (d / "samples").is_dir():
                problems.append(
                    f"{d}: not a run directory (no metrics.jsonl, no samples/; rlzoo train prints it)"
                )
        if problems:
            raise RlzooError("rlzoo view: " + "; ".join(problems))
        self.run_dirs = run_dirs
        names = [d.name for d in run_dirs]
        self.names = [f"{d.parent.name}/{d.name}" if names.count(d.name) > 1 else d.name for d in run_dirs]

    def runs(self) -> list[dict[str, Any]]:
        return [
            {"id": i, "name": n, "path": str(d)} for i, (n, d) in enumerate(zip(self.names, self.run_dirs))
        ]

    def metrics(self, run: int) -> list[dict[str, Any]]:
        rows = read_metrics(self.run_dirs[run])
        return [
            {
                k: v
                for k, v in r.items()
                if k == "step" or (isinstance(v, (int, float)) and not isinstance(v, bool))
            }
            for r in rows
        ]

    def steps(self, run: int, split: str) -> list[int]:
        return sample_steps(self.run_dirs[run], split)

    def samples(self, run: int, split: str, step: int) -> list[dict[str, Any]]:
        return read_samples(self.run_dirs[run], step, split)

    def everything(self) -> dict[str, Any]:
        """All of it, for a self-contained page (``--html``)."""
        return {
            "runs": self.runs(),
            "metrics": [self.metrics(i) for i in range(len(self.run_dirs))],
            "samples": [
                {split: {str(k): self.samples(i, split, k) for k in self.steps(i, split)} for split in SPLITS}
                for i in range(len(self.run_dirs))
            ],
        }


def page(embedded: dict[str, Any] | None = None) -> str:
    """The viewer page; with ``embedded`` data it needs no server."""
    data = ""
    if embedded is not None:
        text = json.dumps(_clean(embedded), separators=(",", ":")).replace("</", "<\\/")
        data = f'<script type="application/json" id="rlzoo-data">{text}</script>'
    return PAGE.replace("<!--DATA-->", data)


def write_html(run_dirs: list[Path], out: Path) -> Path:
    """One self-contained HTML file of the runs (written under a temporary name, then renamed)."""
    html = page(RunData(run_dirs).everything())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, out)
    return out


def make_server(run_dirs: list[Path], host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """The viewer's server, bound (``port`` 0: a free one); call ``serve_forever()``."""
    data = RunData(run_dirs)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return None  # quiet: the terminal shows the URL only

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, obj: Any, code: int = 200) -> None:
            self._send(code, json.dumps(_clean(obj)).encode(), "application/json")

        def do_GET(self) -> None:
            url = urlparse(self.path)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            try:
                if url.path in ("/", "/index.html"):
                    self._send(200, page().encode(), "text/html; charset=utf-8")
                elif url.path == "/favicon.ico":
                    self._send(204, b"", "image/x-icon")
                elif url.path == "/api/runs":
                    self._json(data.runs())
                elif url.path == "/api/metrics":
                    self._json(data.metrics(_index(q, data)))
                elif url.path == "/api/steps":
                    self._json(data.steps(_index(q, data), _split(q)))
                elif url.path == "/api/samples":
                    self._json(data.samples(_index(q, data), _split(q), int(q.get("step", "-1"))))
                else:
                    self._json({"error": f"no such page {url.path}"}, 404)
            except (ValueError, KeyError) as exc:
                self._json({"error": str(exc)}, 400)
            except Exception as exc:  # a file being written, a broken file: say so, keep serving
                self._json({"error": f"{type(exc).__name__}: {exc}"}, 500)

    return ThreadingHTTPServer((host, port), Handler)


def _index(q: dict[str, str], data: RunData) -> int:
    i = int(q.get("run", "0"))
    if not 0 <= i < len(data.run_dirs):
        raise ValueError(f"run {i}: there are {len(data.run_dirs)} runs")
    return i


def _split(q: dict[str, str]) -> str:
    split = q.get("split", "train")
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: train or val")
    return split


def serve_in_thread(
    run_dirs: list[Path], host: str = "127.0.0.1", port: int = 0
) -> tuple[ThreadingHTTPServer, str]:
    """A running server (daemon thread) and its URL; ``server.shutdown()`` stops it (tests)."""
    server = make_server(run_dirs, host, port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://{host}:{server.server_address[1]}/"


# ---------------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------------
def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories; several are overlaid")
    p.add_argument("--html", metavar="FILE", help="write one self-contained page instead of serving")
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")


def _run(ns: argparse.Namespace) -> int:
    runs = [Path(d).expanduser() for d in ns.run_dirs]
    if ns.html:
        print(write_html(runs, Path(ns.html).expanduser()))
        return 0
    if not 0 <= ns.port < 65536:
        raise RlzooError(f"--port {ns.port}: a port is 0..65535 (0: a free one)")
    try:
        server = make_server(runs, "127.0.0.1", ns.port)
    except OSError as exc:
        raise RlzooError(f"cannot listen on 127.0.0.1:{ns.port}: {exc.strerror}; try --port 0") from None
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    print(f"rlzoo view: {url}  (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


EXAMPLES = """\
  rlzoo view runs/quickstart-20250101-120000          # prints http://127.0.0.1:PORT/
  rlzoo view runs/sync-run runs/async-run             # curves overlaid; samples of either
  rlzoo view runs/q --html q.html                     # one self-contained file"""


def view_command() -> CliCommand:
    return CliCommand(
        name="view",
        summary="look at runs in the browser: curves, samples by step, trajectories token by token",
        add_arguments=_add_arguments,
        run=_run,
        examples=EXAMPLES,
    )
