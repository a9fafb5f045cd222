"""Run untrusted code (what a model wrote, a user's program) where it cannot leave.

One API for every caller (scorers, environments, tools): :class:`rlzoo.sandbox.run.Sandbox`
built from :class:`rlzoo.sandbox.params.SandboxParams` runs a program (Python source or an
argv) and returns an :class:`rlzoo.sandbox.run.Execution`; ``sandbox.map`` and ``await
sandbox.arun(...)`` run many at once through a bounded pool of slots. The protections this machine
allows are found once (:func:`rlzoo.sandbox.probe.protections`), logged when a sandbox is built,
and a sandbox whose params ``require`` one the machine lacks refuses to build. With ``url`` set,
:func:`sandbox_for` gives the same API over a SandboxFusion server. docs/code.md
says what each protection stops.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlzoo.sandbox.params import SandboxParams
    from rlzoo.sandbox.run import CodeRunner

_shared: dict[str, CodeRunner] = {}
_lock = threading.Lock()


def sandbox_for(params: SandboxParams) -> CodeRunner:
    """The sandbox for ``params``, one per distinct settings in this process (scorers, environments and
    tools built with equal settings share its pool): a local :class:`~rlzoo.sandbox.run.Sandbox`, or a
    :class:`~rlzoo.sandbox.remote.RemoteSandbox` when ``params.url`` is set. Raises
    :class:`~rlzoo.sandbox.run.SandboxUnavailable` (nothing run) when a required protection is missing."""
    from rlzoo.sandbox.remote import RemoteSandbox
    from rlzoo.sandbox.run import Sandbox

    key = repr(dataclasses.asdict(params))
    with _lock:
        found = _shared.get(key)
        if found is None:
            found = _shared[key] = RemoteSandbox(params) if params.url else Sandbox(params)
        return found
