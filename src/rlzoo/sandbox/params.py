"""The sandbox's settings: one params class, reachable from the recipe in the params of any part that
runs code (e.g. ``reward.scorer: {name: code_tests, sandbox: {...}}``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlzoo.kernel.params import check_ranges, param
from rlzoo.sandbox.probe import PROTECTIONS, protections

#: what ``require`` holds by default: a recipe that runs code on a machine without bubblewrap
#: fails at start, and says how to accept rlimits only
DEFAULT_REQUIRE: tuple[str, ...] = ("pid_namespace", "no_network", "private_fs")


@dataclass(frozen=True)
class SandboxParams:
    """Where and how untrusted code runs (docs/code.md).

    Each execution gets a fresh temporary directory (a size-capped tmpfs under bubblewrap, which is
    also ``/tmp`` and ``$HOME``), its own session, the limits below, an environment built from an
    allow-list (``PATH``, ``HOME``, ``LANG``, ``TMPDIR`` plus ``env``), and, with bubblewrap, its own
    pid, network, ipc and mount namespaces: it sees the interpreter's files read-only and nothing
    else of the machine. Everything it started is killed when it ends or times out. With ``url``
    set, code runs on a SandboxFusion server instead (``/run_code``) and only ``timeout_s``,
    ``memory_mb`` and ``max_parallel`` apply.
    """

    timeout_s: float = param(5.0, gt=0, help="wall-clock seconds one execution may take (then killed)")
    cpu_s: int = param(5, ge=1, help="CPU seconds one execution may use (RLIMIT_CPU)")
    memory_mb: int = param(512, ge=32, help="address space of each process, MiB (RLIMIT_AS)")
    max_processes: int = param(32, ge=1, help="processes and threads at once (RLIMIT_NPROC, own uid)")
    max_open_files: int = param(64, ge=16, help="open file descriptors per process (RLIMIT_NOFILE)")
    max_file_mb: int = param(16, ge=0, help="largest file it may write, MiB (RLIMIT_FSIZE)")
    disk_mb: int = param(64, ge=1, help="size of its working directory (tmpfs, bubblewrap only), MiB")
    max_output_bytes: int = param(
        1_000_000, ge=1024, help="bytes of stdout and of stderr kept; more ends the run (output_limit)"
    )
    max_parallel: int = param(0, ge=0, help="executions at once (the pool's slots); 0: os.cpu_count()")
    isolation: Literal["auto", "bwrap", "rlimits"] = param(
        "auto",
        help="'bwrap': bubblewrap namespaces (fails when unusable); 'rlimits': processes, limits and a "
        "clean environment only; 'auto': bwrap when it works here",
    )
    require: tuple[str, ...] = param(
        DEFAULT_REQUIRE,
        help="protections that must be active, else nothing runs (names in docs/code.md; [] accepts "
        "whatever the machine gives)",
    )
    uid: int = param(
        65534,
        ge=1,
        help="when the caller is root: the highest uid its slots run as, one each, counting down past uids "
        "other sandboxes on the machine hold (its own process count; 65534 = nobody)",
    )
    python: str = param("", help="interpreter for Python source ('': the running one's base interpreter)")
    site_packages: bool = param(
        False, help="let code import the running environment's installed packages (its prefix, read-only)"
    )
    env: dict[str, str] = param({}, help="extra environment variables given to the code")
    url: str = param(
        "", help="a SandboxFusion server's address, with or without /run_code ('': run locally); docs/code.md"
    )

    def run_problems(self) -> list[str]:
        """The protections ``require`` names that this machine lacks (none with ``url``: the server's
        own isolation applies); ``rlzoo validate`` reports them before a run starts
        (:class:`rlzoo.kernel.protocols.RunReadyParams`)."""
        if self.url:
            return []
        found = protections(self.isolation)
        missing = found.missing(self.require)
        if self.isolation == "bwrap" and found.mode != "bwrap":
            missing = sorted({*missing, "pid_namespace", "no_network", "private_fs"})
        if not missing:
            return []
        why = "; ".join(f"{name}: {found.why.get(name, '?')}" for name in missing)
        have = [n for n, on in found.active.items() if on]
        return [
            f"the sandbox requires {missing}, which this machine does not give ({why}); install bubblewrap "
            f"(and let it create namespaces), or accept less with sandbox.require=[...] (active here: {have})"
        ]

    def __post_init__(self) -> None:
        problems = check_ranges(self)
        unknown = sorted(set(self.require) - set(PROTECTIONS))
        if unknown:
            problems.append(f"require names unknown protections {unknown}; known: {list(PROTECTIONS)}")
        if problems:
            raise ValueError("SandboxParams: " + "; ".join(problems))
