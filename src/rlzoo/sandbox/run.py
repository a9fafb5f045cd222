"""The sandbox: run a program in a box it cannot leave, get back what it did (:class:`Execution`).

``Sandbox(params).run(code, stdin=..., files=..., timeout_s=...)`` runs Python source (or
``argv=[...]``) and returns at once when it ends, or kills it at the deadline; ``sandbox.map`` and
``await sandbox.arun(...)`` run many at once through the sandbox's bounded pool of slots (a waiting
caller holds a thread, never the event loop). Every execution:

- a fresh working directory: under bwrap a size-capped tmpfs at ``/sandbox`` (also ``/tmp`` and
  ``$HOME``), the caller's files copied in; otherwise a fresh folder under the system's temp dir;
- its own session and process group; rlimits (CPU, address space, open files, file size, no core
  dumps; as root also the process count, for an unprivileged uid of its slot's own);
- an environment from an allow-list; no network, its own pid and ipc namespaces and a private view of
  the file system when bwrap works here;
- at the end, or at the deadline, its process group is killed (and under bwrap its pid namespace dies
  with it; as root without bwrap every process of its uid is killed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from rlzoo.kernel.errors import RlzooError
from rlzoo.sandbox.params import SandboxParams
from rlzoo.sandbox.probe import Protections, interpreter, namespace_args, protections, system_binds

log = logging.getLogger(__name__)

WORKDIR = "/sandbox"  # the working directory inside a bwrap sandbox
MAIN = "main.py"  # Python source is written here
_READ = 65536
_REAP_WAIT_S = 5.0  # how long a killed execution's orphans may take to be reaped by init
_POLL_S = 0.02
_logged: set[str] = set()
_uids_lock = threading.Lock()
_uid_claims: dict[int, int] = {}  # uid -> the fd of its lock file, held while this process lives
UID_LOCKS = "rlzoo-sandbox-uids"  # folder under the temp dir: one lock file per uid in use


def _take_uids(top: int, n: int) -> list[int]:
    """``n`` uids from ``top`` down that no other sandbox uses, in this process or any other on this
    machine (an exclusive ``flock`` per uid, held until the process ends): a slot's process count and
    the sweep of its leftovers (rlimits mode) never touch another sandbox's processes."""
    import fcntl

    folder = Path(tempfile.gettempdir()) / UID_LOCKS
    folder.mkdir(mode=0o755, exist_ok=True)
    taken: list[int] = []
    with _uids_lock:
        for uid in range(top, 999, -1):
            if len(taken) == n:
                break
            if uid in _uid_claims:
                continue
            fd = os.open(folder / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            _uid_claims[uid] = fd
            taken.append(uid)
    if len(taken) < n:
        raise SandboxUnavailable(
            f"no {n} free sandbox uids from {top} down: too many sandboxes on this machine"
        )
    return taken


class SandboxUnavailable(RlzooError):
    """The params require a protection this machine does not give: nothing was run."""


class Outcome(StrEnum):
    """How an execution ended."""

    OK = "ok"  # exit status 0
    ERROR = "error"  # a non-zero exit status (an exception, sys.exit(1), ...)
    TIMEOUT = "timeout"  # the wall-clock deadline or the CPU limit
    MEMORY = "memory"  # MemoryError (the address-space limit)
    OUTPUT_LIMIT = "output_limit"  # more stdout or stderr than max_output_bytes: killed
    KILLED = "killed"  # ended by a signal (not the CPU limit)


@dataclass(frozen=True)
class Execution:
    """What one execution did. ``stdout`` / ``stderr`` are at most ``max_output_bytes`` each."""

    outcome: Outcome
    returncode: int | None  # the exit status; None when it ended by a signal
    stdout: str
    stderr: str
    wall_s: float
    signal: int | None = None  # the signal that ended it, if any
    truncated: bool = False  # some output was dropped

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK


class CodeRunner(Protocol):
    """What scorers, environments and tools run code through: the local :class:`Sandbox` and the
    remote :class:`rlzoo.sandbox.remote.RemoteSandbox` both are one."""

    params: SandboxParams

    def run(
        self,
        code: str | None = None,
        *,
        argv: Sequence[str] | None = None,
        stdin: str | bytes = b"",
        files: Mapping[str, str | bytes] | None = None,
        timeout_s: float | None = None,
    ) -> Execution: ...

    def submit(self, code: str | None = None, **kw: Any) -> Future[Execution]: ...
    def map(self, requests: Sequence[Mapping[str, Any]]) -> list[Execution]: ...
    async def arun(self, code: str | None = None, **kw: Any) -> Execution: ...
    def close(self) -> None: ...


def _check_name(name: str) -> str:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts or name != str(path):
        raise ValueError(f"sandbox file names are plain relative paths inside the work dir, got {name!r}")
    return name


class Pooled:
    """The pooled forms of a :class:`CodeRunner`'s ``run``, for the local and the remote sandbox alike:
    a thread pool of ``slots`` workers, made on first use."""

    slots: int
    _pool: ThreadPoolExecutor | None = None
    _thread_name = "rlzoo-sandbox"

    run: Callable[..., Execution]  # the subclass's one execution

    def submit(self, code: str | None = None, **kw: Any) -> Future[Execution]:
        """``run`` in the pool (as many at once as there are slots); a Future of its Execution."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.slots, thread_name_prefix=self._thread_name)
        return self._pool.submit(self.run, code, **kw)

    def map(self, requests: Sequence[Mapping[str, Any]]) -> list[Execution]:
        """Run each request (``run``'s keyword arguments) through the pool; results in order."""
        futures = [self.submit(**dict(r)) for r in requests]
        return [f.result() for f in futures]

    async def arun(self, code: str | None = None, **kw: Any) -> Execution:
        """``run`` for async callers: awaits the pool, never blocks the event loop."""
        return await asyncio.wrap_future(self.submit(code, **kw))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class Sandbox(Pooled):
    """Runs untrusted programs (see the module doc); thread-safe, one instance per settings."""

    def __init__(self, params: SandboxParams | None = None) -> None:
        self.params = params or SandboxParams()
        if self.params.url:
            raise ValueError(
                "SandboxParams.url is set: rlzoo.sandbox.sandbox_for(params) gives the remote one"
            )
        self.protections: Protections = protections(self.params.isolation)
        problems = self.params.run_problems()
        if problems:
            raise SandboxUnavailable(problems[0])
        line = self.protections.line()
        if line not in _logged:
            _logged.add(line)
            log.info("%s", line)
            print(f"rlzoo: {line}", flush=True)  # the run's console says which protections are on
            for note in self.protections.notes:
                log.info("sandbox: %s", note)
        self.slots = self.params.max_parallel or os.cpu_count() or 1
        #: the uid of each slot (as root; the caller's own otherwise)
        self.uids = _take_uids(self.params.uid, self.slots) if self.protections.root else []
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for k in range(self.slots):
            self._free.put(k)
        self._pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ the API
    def run(
        self,
        code: str | None = None,
        *,
        argv: Sequence[str] | None = None,
        stdin: str | bytes = b"",
        files: Mapping[str, str | bytes] | None = None,
        timeout_s: float | None = None,
    ) -> Execution:
        """Run Python ``code`` (or the program ``argv``) with ``stdin`` and ``files`` in its work dir."""
        if (code is None) == (argv is None):
            raise ValueError(
                "Sandbox.run takes Python source (code=...) or a command (argv=[...]), one of them"
            )
        files = {_check_name(k): v for k, v in (files or {}).items()}
        if code is not None:
            if MAIN in files:
                raise ValueError(f"files may not contain {MAIN!r}: the code is written there")
            files[MAIN] = code
        timeout = self.params.timeout_s if timeout_s is None else timeout_s
        if not timeout > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout!r}")
        slot = self._free.get()
        try:
            return self._run(slot, code is not None, list(argv or ()), stdin, files, timeout)
        finally:
            self._free.put(slot)

    # ------------------------------------------------------------------ one execution
    def _limits(self, uid: int | None) -> list[str]:
        p = self.params
        cpu = max(1, int(p.cpu_s))
        limits = [
            f"--cpu={cpu}:{cpu + 1}",
            f"--as={p.memory_mb << 20}",
            f"--nofile={p.max_open_files}",
            f"--fsize={p.max_file_mb << 20}",
            "--core=0",
        ]
        if uid is not None:
            limits.append(f"--nproc={p.max_processes}")
        return limits

    def _env(self, home: str) -> dict[str, str]:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.update(self.params.env)
        return env

    def _command(
        self, uid: int | None, host_dir: Path, is_python: bool, argv: list[str], names: list[str]
    ) -> tuple[list[str], dict[str, str] | None, list[int]]:
        """The full argv (prlimit, bwrap, setpriv, the program), the env to start it with, fds to pass."""
        prot = self.protections
        exe, prefixes = interpreter(self.params.python, self.params.site_packages)
        program = [exe, "-I", MAIN] if is_python else argv
        limits = [prot.tools.prlimit, *self._limits(uid), "--"] if prot.tools.prlimit else []
        if prot.mode != "bwrap":
            env = self._env(str(host_dir))
            if uid is not None and prot.tools.setpriv:  # as root: setpriv drops to the slot's uid at exec
                return [*limits, prot.tools.setpriv, *_drop(uid), "--", *program], env, []
            return [*limits, *program], env, []  # (as root without setpriv: Popen's user= drops it)
        cmd = [prot.tools.bwrap, *namespace_args(prot.root), "--die-with-parent", "--new-session"]
        cmd += system_binds()
        for prefix in prefixes:
            if not (prefix == "/usr" or prefix.startswith("/usr/")):
                cmd += ["--ro-bind", prefix, prefix]
        cmd += [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            str(self.params.disk_mb << 20),
            "--tmpfs",
            WORKDIR,
        ]
        fds: list[int] = []
        for name in names:
            parent = str(PurePosixPath(WORKDIR, name).parent)
            if parent != WORKDIR:
                cmd += ["--dir", parent]
            fd = os.open(host_dir / name, os.O_RDONLY)
            fds.append(fd)
            cmd += ["--perms", "0644", "--file", str(fd), f"{WORKDIR}/{name}"]
        cmd += ["--chmod", "1777", WORKDIR, "--symlink", WORKDIR, "/tmp", "--chdir", WORKDIR, "--clearenv"]
        for key, value in self._env(WORKDIR).items():
            cmd += ["--setenv", key, value]
        if uid is not None:
            cmd += [
                "--cap-add",
                "CAP_SETUID",
                "--cap-add",
                "CAP_SETGID",
                prot.tools.setpriv,
                *_drop(uid),
                "--",
            ]
        elif prot.active["process_limit"]:
            # set inside the new user namespace, RLIMIT_NPROC counts the sandbox's processes alone
            cmd += [prot.tools.prlimit, f"--nproc={self.params.max_processes}", "--"]
        return [*limits, *cmd, *program], {"PATH": "/usr/bin:/bin"}, fds

    def _run(
        self,
        slot: int,
        is_python: bool,
        argv: list[str],
        stdin: str | bytes,
        files: Mapping[str, str | bytes],
        timeout: float,
    ) -> Execution:
        prot = self.protections
        uid = self.uids[slot] if prot.root else None
        host_dir = Path(tempfile.mkdtemp(prefix="rlzoo-sandbox-"))
        fds: list[int] = []
        try:
            for name, content in files.items():
                path = host_dir / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content.encode() if isinstance(content, str) else content)
            stdin_path = host_dir.with_name(host_dir.name + ".stdin")
            stdin_path.write_bytes(stdin.encode() if isinstance(stdin, str) else stdin)
            if uid is not None and prot.mode != "bwrap":
                for path in [host_dir, *host_dir.rglob("*")]:
                    os.chown(path, uid, uid)
            cmd, env, fds = self._command(uid, host_dir, is_python, argv, list(files))
            with stdin_path.open("rb") as stdin_file:
                return self._execute(cmd, env, fds, stdin_file, host_dir, uid, timeout)
        finally:
            for fd in fds:
                os.close(fd)
            shutil.rmtree(host_dir, ignore_errors=True)
            host_dir.with_name(host_dir.name + ".stdin").unlink(missing_ok=True)

    def _execute(
        self,
        cmd: list[str],
        env: dict[str, str] | None,
        fds: list[int],
        stdin_file: Any,
        host_dir: Path,
        uid: int | None,
        timeout: float,
    ) -> Execution:
        bwrap = self.protections.mode == "bwrap"
        setpriv = bool(self.protections.tools.setpriv)
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            stdin=stdin_file,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=None if bwrap else host_dir,
            env=env,
            pass_fds=fds,
            start_new_session=True,
            preexec_fn=None if self.protections.tools.prlimit else self._preexec,
            # without bwrap and setpriv, root becomes the slot's uid before exec (groups cleared)
            user=None if (bwrap or uid is None or setpriv) else uid,
            group=None if (bwrap or uid is None or setpriv) else uid,
            extra_groups=None if (bwrap or uid is None or setpriv) else [],
        )
        limit = self.params.max_output_bytes
        out: dict[int, bytearray] = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}  # type: ignore[union-attr]
        sel = selectors.DefaultSelector()
        for stream in (proc.stdout, proc.stderr):
            os.set_blocking(stream.fileno(), False)  # type: ignore[union-attr]
            sel.register(stream, selectors.EVENT_READ)  # type: ignore[arg-type]
        deadline = start + timeout
        timed_out = over = False
        open_streams = 2
        try:
            while not over:
                if proc.poll() is not None:
                    break  # the program ended: what it left running is killed below
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                if not open_streams:  # it closed both streams and runs on
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(_POLL_S)
                    continue
                for key, _ in sel.select(_POLL_S):
                    chunk = _read(key.fd)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        open_streams -= 1
                        continue
                    buf = out[key.fd]
                    buf += chunk[: max(0, limit + 1 - len(buf))]
                    if len(buf) > limit:
                        over = True
        finally:
            _kill_all(proc, uid if (uid is not None and not bwrap) else None)
            for key in list(sel.get_map().values()):  # what is still buffered in the pipes
                buf = out[key.fd]
                while (chunk := _read(key.fd)) and len(buf) <= limit:
                    buf += chunk[: max(0, limit + 1 - len(buf))]
            sel.close()
            proc.stdout.close()  # type: ignore[union-attr]
            proc.stderr.close()  # type: ignore[union-attr]
        wall = time.monotonic() - start
        rc = proc.returncode
        sig: int | None = None
        if rc is not None and rc < 0:
            sig, rc = -rc, None
        elif bwrap and rc is not None and rc > 128:  # bwrap's pid 1 reports a signal as 128 + n
            sig, rc = rc - 128, None
        stdout_b, stderr_b = (bytes(b) for b in out.values())
        truncated = len(stdout_b) > limit or len(stderr_b) > limit
        stdout_b, stderr_b = stdout_b[:limit], stderr_b[:limit]
        stderr = stderr_b.decode("utf-8", "replace")
        if over:
            outcome = Outcome.OUTPUT_LIMIT
        elif timed_out or sig == signal.SIGXCPU:
            outcome = Outcome.TIMEOUT
        elif sig is not None:
            outcome = Outcome.KILLED
        elif rc == 0:
            outcome = Outcome.OK
        elif "MemoryError" in stderr[-2000:]:
            outcome = Outcome.MEMORY
        else:
            outcome = Outcome.ERROR
        return Execution(
            outcome=outcome,
            returncode=rc,
            stdout=stdout_b.decode("utf-8", "replace"),
            stderr=stderr,
            wall_s=wall,
            signal=sig,
            truncated=truncated,
        )

    def _preexec(self) -> None:  # only without prlimit(1): rlimits set in the child before exec
        import resource

        p = self.params
        resource.setrlimit(resource.RLIMIT_CPU, (p.cpu_s, p.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (p.memory_mb << 20, p.memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_NOFILE, (p.max_open_files, p.max_open_files))
        resource.setrlimit(resource.RLIMIT_FSIZE, (p.max_file_mb << 20, p.max_file_mb << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if self.protections.root:
            resource.setrlimit(resource.RLIMIT_NPROC, (p.max_processes, p.max_processes))


def _drop(uid: int) -> list[str]:
    """setpriv's arguments: become ``uid`` with no groups, no capabilities, no way back."""
    return [
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
    ]


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, _READ)
    except BlockingIOError:
        return b""
    except OSError:
        return b""


def _kill_all(proc: subprocess.Popen[bytes], uid: int | None) -> None:
    """Kill the execution's process group (its session), wait for it, and, when it ran as a uid of its
    own without a pid namespace, every process left with that uid (a daemon that left the group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if uid is None:
        return
    for _ in range(20):  # a process may fork while we sweep: sweep until none is left
        pids = _pids_of(uid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not pids:
            return
        time.sleep(0.01)
    # killed orphans stay zombies until init reaps them, and a zombie still counts against the
    # slot's RLIMIT_NPROC: the next execution as this uid could not fork (seen after a fork bomb on a
    # loaded machine: BlockingIOError in a test's first fork). Wait for them to go, within a bound.
    deadline = time.monotonic() + _REAP_WAIT_S
    while _pids_of(uid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if _pids_of(uid):
        log.warning(
            "sandbox: processes of uid %d are still not reaped %.0f s after being killed; the next "
            "execution as this uid may be refused new processes",
            uid,
            _REAP_WAIT_S,
        )


def _pids_of(uid: int) -> list[int]:
    """Every process (zombies included) owned by ``uid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid == uid:
                out.append(int(entry.name))
        except FileNotFoundError:
            continue
    return out
