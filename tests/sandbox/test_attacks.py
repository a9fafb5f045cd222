"""The attack suite: model "responses" that try to leave the sandbox, each contained.

Each attack runs in both isolation modes (``auto``: bubblewrap where it works; ``rlimits``: processes,
limits, a clean environment and, as root, a uid of its own). An attack runs only where one of the
protections that stop it (:data:`ATTACKS`) is active; elsewhere it is skipped with the reason, and
the table at the end of the session (tests/sandbox/conftest.py) shows which attacks this machine's
sandbox stops and by which protection. For every attack: the secret is not in the output, the file
outside is untouched, the outcome is the right failure, the caller goes on (a plain run after it
works) and nothing it started is left running.
"""

from __future__ import annotations

import os
import platform
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from rlzoo.sandbox.params import SandboxParams
from rlzoo.sandbox.run import Execution, Outcome, Sandbox

#: small limits keep the suite fast
LIMITS = {"timeout_s": 1.5, "cpu_s": 1, "memory_mb": 128, "max_processes": 16, "disk_mb": 8, "max_file_mb": 4}
LIMITS_OUTPUT = 64 * 1024


@dataclass(frozen=True)
class Attack:
    name: str
    stopped_by: tuple[str, ...]  # any one of these protections contains it
    outcomes: tuple[Outcome, ...]  # how the execution may end


ATTACKS: dict[str, Attack] = {
    a.name: a
    for a in [
        Attack("read the run's config.yaml", ("private_fs", "separate_uid"), (Outcome.ERROR,)),
        Attack("read $HOME", ("private_fs", "separate_uid"), (Outcome.ERROR,)),
        Attack("read env secrets", ("clean_env",), (Outcome.OK,)),
        Attack("write into the run dir", ("private_fs", "separate_uid"), (Outcome.ERROR,)),
        Attack("TCP connect to a loopback port", ("no_network",), (Outcome.ERROR,)),
        Attack("resolve a host name", ("no_network",), (Outcome.ERROR,)),
        Attack("fork bomb", ("process_limit",), (Outcome.ERROR, Outcome.TIMEOUT, Outcome.KILLED)),
        Attack("allocate 10x the memory limit", ("rlimits",), (Outcome.MEMORY,)),
        Attack("spin forever", ("rlimits", "own_session"), (Outcome.TIMEOUT,)),
        Attack("double-fork a daemon and exit", ("pid_namespace", "separate_uid"), (Outcome.OK,)),
        Attack("os.kill the parent", ("pid_namespace", "separate_uid"), (Outcome.ERROR,)),
        Attack("ctypes raw syscalls", ("private_fs", "separate_uid"), (Outcome.OK,)),
        Attack("fill the disk", ("private_fs",), (Outcome.ERROR,)),
        Attack("print gigabytes", ("own_session",), (Outcome.OUTPUT_LIMIT,)),
    ]
}

#: (mode, attack) -> the protection that contained it, or why it was skipped (conftest prints it)
RESULTS: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module", params=["auto", "rlimits"])
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    params = SandboxParams(
        isolation=request.param, require=(), max_output_bytes=LIMITS_OUTPUT, max_parallel=2, **LIMITS
    )
    box = Sandbox(params)
    yield box
    box.close()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run directory outside the sandbox, as a training run leaves it (owner-only, like rlzoo's)."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "config.yaml").write_text("api_key: sk-SECRET-RUN-CONFIG\n")
    return run


def _uid_processes(box: Sandbox) -> list[psutil.Process]:
    if not box.protections.root:
        return []
    uids = set(box.uids)
    found = []
    for p in psutil.process_iter(["uids", "status"]):
        if p.info["uids"] and p.info["uids"].real in uids and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _left_running(box: Sandbox, marker: str, before: set[int]) -> list[str]:
    """What the attack left: processes naming its marker, of the sandbox's uids, or children of the test
    that were not there before it (earlier tests in the same session may leave their own). A process
    the sandbox has just sent SIGKILL may take a moment to go: asked again for up to 2 s."""
    deadline = time.monotonic() + 2.0
    while True:
        found = _still_running(box, marker, before)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _still_running(box: Sandbox, marker: str, before: set[int]) -> list[str]:
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if marker in cmd:
            found.append(f"{p.info['pid']}: {cmd[:80]}")
    for p in _uid_processes(box):
        try:
            found.append(
                f"{p.pid} (sandbox uid, {p.status()}, ppid {p.ppid()}): {' '.join(p.cmdline())[:80]}"
            )
        except psutil.NoSuchProcess:
            continue
    found += [
        f"{p.pid} (child of the test)"
        for p in psutil.Process().children(recursive=True)
        if p.pid not in before
    ]
    return found


def _contain(box: Sandbox, name: str, run: Callable[[str], Execution]) -> Execution:
    """Run the attack if this sandbox has a protection that stops it; check the common promises."""
    attack = ATTACKS[name]
    mode = box.params.isolation
    stoppers = [p for p in attack.stopped_by if box.protections.active[p]]
    if not stoppers:
        RESULTS[(mode, name)] = "NOT STOPPED: needs " + " or ".join(attack.stopped_by)
        pytest.skip(
            f"{name!r} is stopped by {' or '.join(attack.stopped_by)}; this machine's {mode} sandbox has none"
        )
    marker = f"rlzoo-attack-{uuid.uuid4().hex}"
    before = _children()
    ex = run(marker)
    assert ex.outcome in attack.outcomes, (ex.outcome, ex.stdout[-500:], ex.stderr[-1000:])
    assert ex.wall_s < box.params.timeout_s + 3.0
    left = _left_running(box, marker, before)
    assert not left, f"left running after {name!r}: {left}"
    after = box.run("print(6 * 7)")  # the caller goes on
    assert after.ok and after.stdout == "42\n", after
    RESULTS[(mode, name)] = "stopped by " + " / ".join(stoppers)
    return ex


def test_read_the_runs_config(sandbox: Sandbox, run_dir: Path) -> None:
    code = f"print(open({str(run_dir / 'config.yaml')!r}).read())"
    ex = _contain(sandbox, "read the run's config.yaml", lambda m: sandbox.run(code))
    assert "SECRET" not in ex.stdout and ("FileNotFoundError" in ex.stderr or "PermissionError" in ex.stderr)


def test_read_home(sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / ".netrc").write_text("machine api password SECRET-HOME\n")
    monkeypatch.setenv("HOME", str(home))
    code = f"import os; print(os.listdir({str(home)!r})); print(open({str(home / '.netrc')!r}).read())"
    ex = _contain(sandbox, "read $HOME", lambda m: sandbox.run(code))
    assert "SECRET" not in ex.stdout and ".netrc" not in ex.stdout


def test_read_env_secrets(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("WANDB_API_KEY", "OPENAI_API_KEY", "RAY_ADDRESS", "RLZOO_TEST_SECRET"):
        monkeypatch.setenv(key, f"SECRET-{key}")
    code = (
        "import os\nprint(dict(os.environ))\n"
        "for pid in ('1', str(os.getppid()), 'self'):\n"
        "    try: print(open(f'/proc/{pid}/environ', 'rb').read())\n"
        "    except OSError as e: print('denied', pid, e)\n"
    )
    ex = _contain(sandbox, "read env secrets", lambda m: sandbox.run(code))
    assert "SECRET" not in ex.stdout, ex.stdout
    assert "HOME" in ex.stdout  # it did read an environment: the allow-listed one


def test_write_into_the_run_dir(sandbox: Sandbox, run_dir: Path) -> None:
    target = run_dir / "checkpoint.pt"
    code = f"open({str(target)!r}, 'w').write('pwned')"
    _contain(sandbox, "write into the run dir", lambda m: sandbox.run(code))
    assert not target.exists() and sorted(p.name for p in run_dir.iterdir()) == ["config.yaml"]


def test_tcp_connect_to_a_loopback_port(sandbox: Sandbox) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted.append(conn.recv(100))
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    code = (
        f"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=1); s.sendall(b'hello')"
    )
    try:
        ex = _contain(sandbox, "TCP connect to a loopback port", lambda m: sandbox.run(code))
    finally:
        stop.set()
        thread.join()
        server.close()
    assert not accepted and ("ConnectionRefused" in ex.stderr or "OSError" in ex.stderr), ex.stderr


def test_resolve_a_host_name(sandbox: Sandbox) -> None:
    code = "import socket; print(socket.getaddrinfo('example.com', 443))"
    ex = _contain(sandbox, "resolve a host name", lambda m: sandbox.run(code))
    assert "gaierror" in ex.stderr, ex.stderr


def test_fork_bomb(sandbox: Sandbox) -> None:
    code = "import os\nwhile True:\n    os.fork()\n"
    _contain(sandbox, "fork bomb", lambda m: sandbox.run(code))


def test_allocate_ten_times_the_memory_limit(sandbox: Sandbox) -> None:
    code = f"x = bytearray({10 * LIMITS['memory_mb']} * 2**20); print(len(x))"
    ex = _contain(sandbox, "allocate 10x the memory limit", lambda m: sandbox.run(code))
    assert ex.stdout == ""


def test_spin_forever(sandbox: Sandbox) -> None:
    ex = _contain(sandbox, "spin forever", lambda m: sandbox.run("while True:\n    pass\n"))
    assert ex.wall_s >= min(LIMITS["cpu_s"], LIMITS["timeout_s"]) * 0.9


def test_double_fork_a_daemon_and_exit(sandbox: Sandbox) -> None:
    def code(marker: str) -> str:
        return (
            "import os, sys\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])\n"
            "    os._exit(0)\n"
            "os.wait()\n"
            "print('parent leaves')\n"
        )

    ex = _contain(sandbox, "double-fork a daemon and exit", lambda m: sandbox.run(code(m)))
    assert ex.stdout == "parent leaves\n"


def test_kill_the_parent(sandbox: Sandbox) -> None:
    me = os.getpid()
    code = (
        "import os, signal\n"
        "try: os.kill(os.getppid(), signal.SIGKILL)\n"
        "except OSError as e: print('parent:', e)\n"
        f"os.kill({me}, signal.SIGKILL)\n"
    )
    ex = _contain(sandbox, "os.kill the parent", lambda m: sandbox.run(code))
    assert "PermissionError" in ex.stderr or "ProcessLookupError" in ex.stderr, ex.stderr


def test_ctypes_raw_syscalls(sandbox: Sandbox, run_dir: Path) -> None:
    numbers = {"x86_64": (257,), "aarch64": (56,)}.get(platform.machine())
    if numbers is None:
        pytest.skip(f"no syscall numbers written down for {platform.machine()}")
    target = run_dir / "raw.txt"
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"fd = libc.syscall({numbers[0]}, -100, {str(target).encode()!r}, os.O_WRONLY | os.O_CREAT, 0o644)\n"
        "print('openat', fd, ctypes.get_errno())\n"
        "if fd >= 0: os.write(fd, b'pwned')\n"
    )
    ex = _contain(sandbox, "ctypes raw syscalls", lambda m: sandbox.run(code))
    assert ex.stdout.startswith("openat -1 "), ex.stdout
    assert not target.exists()


def test_fill_the_disk(sandbox: Sandbox) -> None:
    code = (
        "i = 0\n"
        "while True:\n"
        "    with open(f'fill{i}.bin', 'wb') as f:\n"
        "        for _ in range(4):\n"
        "            f.write(b'x' * 2**20)\n"
        "    i += 1\n"
    )
    ex = _contain(sandbox, "fill the disk", lambda m: sandbox.run(code))
    assert "No space left" in ex.stderr or "File too large" in ex.stderr, ex.stderr[-500:]


def test_print_gigabytes(sandbox: Sandbox) -> None:
    code = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"
    ex = _contain(sandbox, "print gigabytes", lambda m: sandbox.run(code))
    assert len(ex.stdout) <= LIMITS_OUTPUT and ex.truncated
