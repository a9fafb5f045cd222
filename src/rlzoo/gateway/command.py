"""The ``command`` agent: any program, in any language, plays an episode.

It is started once per episode with the gateway's address and key in ``OPENAI_BASE_URL`` /
``OPENAI_API_KEY`` (and the model in ``OPENAI_MODEL``), reads the dataset row as JSON on stdin and
prints its result as a JSON object on stdout (``{"reward": ..., "final_answer": ..., "info":
{...}}``; the last line that is a JSON object, so it may print logs before it). A non-zero exit, no
such line, or more than ``rollout.gateway.max_result_bytes`` on stdout fails the episode, with the
end of its stderr in the message; past ``rollout.gateway.agent_timeout_s`` its process group is
killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rlzoo.kernel.protocols import AgentResult, ClientConfig

__all__ = ["CommandAgent", "make_command", "read_result"]

#: characters of stderr / stdout quoted in a failure
_TAIL = 800


class CommandAgent:
    """Runs ``argv`` once per episode (module docstring)."""

    def __init__(
        self, argv: Sequence[str], *, cwd: str | None = None, max_result_bytes: int = 1_000_000
    ) -> None:
        if not argv or not all(isinstance(a, str) and a for a in argv):
            raise ValueError(f"rollout.agent.argv must be a non-empty list of strings, got {list(argv)!r}")
        # "python" is the run's own interpreter (its packages, its virtual environment)
        self.argv = [sys.executable if argv[0] == "python" else argv[0], *argv[1:]]
        self.cwd, self.max_result_bytes = cwd, int(max_result_bytes)

    async def run(self, client: ClientConfig, row: Mapping[str, Any]) -> AgentResult:
        env = {**os.environ, **client.env()}
        proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=self.cwd,
            env=env,
            start_new_session=True,  # its own process group: a timeout ends its children too
        )
        try:
            out, err = await proc.communicate(json.dumps(row).encode("utf-8"))
        except BaseException:  # cancelled at the timeout: end the whole group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 5)
            raise
        tail = err.decode("utf-8", "replace")[-_TAIL:]
        if proc.returncode != 0:
            raise RuntimeError(
                f"{self.argv[0]} exited with status {proc.returncode}; its stderr ends: {tail!r}"
            )
        if len(out) > self.max_result_bytes:
            raise ValueError(
                f"{self.argv[0]} printed {len(out)} bytes on stdout, more than rollout.gateway.max_result_bytes="
                f"{self.max_result_bytes}"
            )
        return read_result(out.decode("utf-8", "replace"), self.argv[0])


def read_result(stdout: str, who: str = "the agent") -> AgentResult:
    """The result in a command's stdout: the last line that is a JSON object."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            unknown = sorted(set(obj) - {"reward", "final_answer", "info"})
            if unknown:
                raise ValueError(
                    f"{who} printed a result with unknown keys {unknown}; a result has reward, final_answer, info"
                )
            info = obj.get("info") or {}
            if not isinstance(info, dict):
                raise ValueError(f"{who} printed info {info!r}: it must be an object")
            return AgentResult(reward=obj.get("reward"), final_answer=obj.get("final_answer"), info=info)
    raise ValueError(
        f'{who} printed no JSON object line on stdout (its result: {{"reward": ..., "final_answer": ...}}); '
        f"stdout ends: {stdout[-_TAIL:]!r}"
    )


def make_command(params: Any) -> CommandAgent:
    """The ``command`` agent part's factory (params: ``rlzoo.tasks.agents.CommandAgentParams``)."""
    return CommandAgent(params.argv, cwd=params.cwd, max_result_bytes=params.max_result_bytes)
