"""What this machine lets a sandbox use: found once per process by trying it, never assumed.

bubblewrap is tried with the very flags an execution uses (as root: privileged bwrap without a user
namespace, then ``setpriv`` drops to an unprivileged uid; otherwise: bwrap in a user namespace). What
an unprivileged user would get is probed too (as uid 65534 when the caller is root) and reported.
seccomp and Landlock are not used: no maintained Python binding is a dependency (bwrap's namespaces
and the uid of its own already stop what they would; docs/code.md).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

#: every protection a sandbox may use, by name (docs/code.md says what each one stops)
PROTECTIONS: tuple[str, ...] = (
    "rlimits",  # CPU seconds, address space, open files, file size, core dumps
    "process_limit",  # RLIMIT_NPROC counted for a uid of the sandbox's own
    "clean_env",  # the environment is an allow-list, not the caller's
    "own_session",  # its own session and process group, killed as a whole
    "separate_uid",  # runs as an unprivileged uid of its own (when the caller is root)
    "pid_namespace",  # sees only its own processes; everything dies with it
    "no_network",  # a network namespace with nothing in it
    "private_fs",  # a mount namespace: only the interpreter's files, read-only, and a fresh tmpfs
    "ipc_namespace",  # no shared memory / semaphores with the host
    "seccomp",  # a system-call filter (not used: no maintained binding installed)
    "landlock",  # a Landlock ruleset (not used: no maintained binding installed)
)

#: how long one probe may take (bwrap starts in milliseconds; a hang means it does not work)
PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Tools:
    """The system programs a sandbox uses ('' where absent)."""

    bwrap: str
    setpriv: str
    prlimit: str


@dataclass(frozen=True)
class Protections:
    """What a sandbox of one isolation mode gets on this machine: each protection on or off, why."""

    mode: str  # "bwrap" | "rlimits"
    active: dict[str, bool]
    why: dict[str, str]  # protection -> how it is given, or why it is not
    root: bool
    tools: Tools
    #: bwrap with user, pid, net and ipc namespaces works for an unprivileged user here
    unprivileged_bwrap: bool
    notes: list[str] = field(default_factory=list)

    def missing(self, required: tuple[str, ...] | list[str]) -> list[str]:
        return [name for name in required if not self.active.get(name, False)]

    def line(self) -> str:
        """The log line: mode, then each protection on (+) or off (-)."""
        marks = " ".join(("+" if self.active[n] else "-") + n for n in PROTECTIONS)
        return f"sandbox[{self.mode}]: {marks}"


def _which(name: str) -> str:
    for folder in ("/usr/bin", "/bin", "/usr/local/bin"):
        candidate = Path(folder) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(name) or ""


def find_tools() -> Tools:
    return Tools(bwrap=_which("bwrap"), setpriv=_which("setpriv"), prlimit=_which("prlimit"))


def _try(argv: list[str], user: int | None = None) -> tuple[bool, str]:
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            user=user,
            group=user,
            extra_groups=[] if user is not None else None,
            env={"PATH": "/usr/bin:/bin"},
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if done.returncode != 0:
        return False, (done.stderr or done.stdout).strip()[-300:] or f"exit {done.returncode}"
    return True, ""


def system_binds() -> list[str]:
    """bwrap arguments that show the OS's programs and libraries read-only (merged-/usr symlinks kept)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        path = Path(top)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            args += ["--ro-bind", top, top]
    return args


def namespace_args(root: bool) -> list[str]:
    """The namespaces of an execution: privileged bwrap (root) needs no user namespace."""
    spaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    return spaces if root else ["--unshare-user", *spaces]


def _bwrap_probe(tools: Tools, root: bool, as_user: int | None) -> tuple[bool, str]:
    if not tools.bwrap:
        return False, "bubblewrap (bwrap) is not installed"
    inner = ["/usr/bin/true"] if Path("/usr/bin/true").exists() else ["/bin/true"]
    argv = [tools.bwrap, *namespace_args(root), "--die-with-parent", "--new-session"]
    argv += [
        *system_binds(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(1 << 20),
        "--tmpfs",
        "/sandbox",
    ]
    if root:
        if not tools.setpriv:
            return False, "running as root needs setpriv (util-linux) to drop to an unprivileged uid"
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", tools.setpriv, "--reuid=65534"]
        argv += [
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
    ok, err = _try([*argv, *inner], user=as_user)
    return ok, err


def _seccomp_landlock_notes() -> dict[str, str]:
    return {
        "seccomp": "not used: no maintained Python seccomp binding is a dependency (bwrap's --seccomp needs "
        "a compiled filter)",
        "landlock": "not used: no maintained Python Landlock binding is a dependency; the mount namespace "
        "already hides the file system",
    }


@functools.lru_cache(maxsize=4)
def protections(isolation: str = "auto") -> Protections:
    """The protections a sandbox with ``isolation`` ('auto' | 'bwrap' | 'rlimits') gets here."""
    tools = find_tools()
    root = os.geteuid() == 0
    why: dict[str, str] = {}
    bwrap_ok, bwrap_err = (
        (False, "isolation: rlimits") if isolation == "rlimits" else _bwrap_probe(tools, root, None)
    )
    unpriv_ok, unpriv_err = _bwrap_probe(tools, False, 65534 if root else None)
    notes = [] if unpriv_ok else [f"an unprivileged user gets no bwrap sandbox here: {unpriv_err}"]
    mode = "bwrap" if bwrap_ok else "rlimits"
    if isolation == "bwrap" and not bwrap_ok:
        notes.append(f"isolation 'bwrap' asked for, but bwrap does not work here: {bwrap_err}")
    spaces = {
        "pid_namespace": "bwrap --unshare-pid: the code's pid 1 is bwrap; when it ends every process dies",
        "no_network": "bwrap --unshare-net: only a loopback interface of its own, down",
        "private_fs": "bwrap mount namespace: /usr and the interpreter read-only, a size-capped tmpfs at /sandbox",
        "ipc_namespace": "bwrap --unshare-ipc",
    }
    for name, how in spaces.items():
        why[name] = how if bwrap_ok else f"off: {bwrap_err or 'bwrap not used'}"
    why["rlimits"] = "RLIMIT_CPU, RLIMIT_AS, RLIMIT_NOFILE, RLIMIT_FSIZE, RLIMIT_CORE=0"
    why["clean_env"] = "allow-list: PATH, HOME, LANG, TMPDIR and the params' env"
    why["own_session"] = "setsid: its process group is killed at the end and at the timeout"
    if root:
        why["separate_uid"] = (
            "root drops to a uid of the slot's own (from params.uid down) before the code runs"
        )
        why["process_limit"] = "RLIMIT_NPROC counted for that uid alone"
    else:
        why["separate_uid"] = "off: not root, the code runs as the caller's uid"
        if bwrap_ok and tools.prlimit:
            why["process_limit"] = (
                "RLIMIT_NPROC set inside the sandbox's user namespace: its processes alone count"
            )
        else:
            why["process_limit"] = (
                "off: outside a user namespace of its own RLIMIT_NPROC would count all of the caller's "
                "processes and threads (not root: no uid of its own)"
            )
    nproc = root or (bwrap_ok and bool(tools.prlimit))
    why.update(_seccomp_landlock_notes())
    active = {
        "rlimits": True,
        "clean_env": True,
        "own_session": True,
        "separate_uid": root,
        "process_limit": nproc,
        "seccomp": False,
        "landlock": False,
        **dict.fromkeys(spaces, bwrap_ok),
    }
    return Protections(
        mode=mode,
        active=active,
        why=why,
        root=root,
        tools=tools,
        unprivileged_bwrap=unpriv_ok,
        notes=notes,
    )


def interpreter(python: str, site_packages: bool) -> tuple[str, list[str]]:
    """The interpreter to run Python source with, and the folders it needs (read-only binds)."""
    if python:
        exe = os.path.realpath(python)
        return exe, [str(Path(exe).parent.parent)]
    if site_packages:
        return sys.executable, sorted({sys.base_prefix, sys.prefix})
    return os.path.realpath(sys.executable), [sys.base_prefix]
