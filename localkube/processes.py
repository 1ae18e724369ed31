"""Long-running cluster processes: started detached with a log and a pid file, stopped by pid.

The processes outlive the `make cluster` that starts them (their own session, no controlling
terminal), and a later `make cluster-down` finds them again through their pid files.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["ProcessError", "log_tail", "running", "start", "stop", "wait_for"]


_STARTED: list[subprocess.Popen[bytes]] = []
"""The processes this one started, kept: a Popen dropped while its process runs warns
("subprocess … is still running"), which the e2e tests, bringing the cluster up inside
pytest with warnings as errors, reported as an error of their first test. They are meant
to outlive this process."""


class ProcessError(RuntimeError):
    """A cluster process failed to start or to become ready; the message quotes its log."""


def start(name: str, argv: Sequence[str | Path], *, logs: Path, pids: Path) -> int:
    """Start `argv` as `name` unless it already runs; return its pid."""
    existing = running(name, pids)
    if existing is not None:
        return existing
    logs.mkdir(parents=True, exist_ok=True)
    pids.mkdir(parents=True, exist_ok=True)
    with (logs / f"{name}.log").open("ab") as log:
        process = subprocess.Popen(
            [str(a) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    (pids / f"{name}.pid").write_text(f"{process.pid}\n")
    _STARTED.append(process)
    return process.pid


def running(name: str, pids: Path) -> int | None:
    """The pid of `name` if its pid file names a live process, else None."""
    try:
        pid = int((pids / f"{name}.pid").read_text())
    except (FileNotFoundError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    if _is_zombie(pid):
        return None
    return pid


def stop(name: str, pids: Path, timeout: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after `timeout`; the pid file goes either way."""
    pid = running(name, pids)
    if pid is not None:
        _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while running(name, pids) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        if running(name, pids) is not None:
            _signal(pid, signal.SIGKILL)
            while running(name, pids) is not None:
                time.sleep(0.1)
    (pids / f"{name}.pid").unlink(missing_ok=True)


def wait_for(
    what: str, ready: Callable[[], bool], *, timeout: float, name: str, logs: Path, pids: Path
) -> None:
    """Poll `ready` until true; fail early if the process dies, quoting its log's tail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        if running(name, pids) is None:
            raise ProcessError(f"{name} exited before {what}:\n{log_tail(logs / f'{name}.log')}")
        time.sleep(0.25)
    raise ProcessError(
        f"{name}: no {what} within {timeout:.0f} s:\n{log_tail(logs / f'{name}.log')}"
    )


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _is_zombie(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, IndexError):
        return True
    return fields[0] == "Z"


def log_tail(path: Path, lines: int = 25) -> str:
    """The last `lines` of a log, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def run_kubectl(
    kubectl: Path,
    kubeconfig: Path,
    args: Sequence[str],
    stdin: str | None = None,
    *,
    retry_until: float | None = None,
    pause_s: float = 1.0,
) -> str:
    """Run kubectl with `kubeconfig`; until the monotonic time `retry_until`, a failure is
    tried again every `pause_s`; after it (or without it) raise with kubectl's output."""
    while True:
        result = subprocess.run(
            [str(kubectl), f"--kubeconfig={kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode == 0:
            return result.stdout
        if retry_until is None or time.monotonic() > retry_until:
            raise RuntimeError(f"kubectl {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
        time.sleep(pause_s)
