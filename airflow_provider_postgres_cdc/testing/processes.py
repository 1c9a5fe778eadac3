"""Process helpers of the test kit: free ports, commands whose output is watched, process groups.

Servers under test (PostgreSQL, the Airflow components) run as their own process groups so
that stopping one also stops what it forked; a test that fails midway leaves nothing running.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = [
    "free_port",
    "process_group_alive",
    "program_beside_python",
    "run_merged_output",
    "terminate_process_groups",
]


def program_beside_python(name: str) -> Path | None:
    """``name`` from this Python's ``bin`` (a virtualenv's scripts, activated or not), else ``PATH``."""
    beside = Path(sys.executable).with_name(name)
    if beside.is_file():
        return beside
    found = shutil.which(name)
    return Path(found) if found else None


def free_port() -> int:
    """Ask the kernel for a currently free loopback TCP port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _signal_group(process_group_id: int, signal_number: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process_group_id, signal_number)


def terminate_process_groups(processes: list[subprocess.Popen[bytes]], grace: float) -> None:
    """SIGTERM the process groups led by ``processes``, wait up to ``grace`` seconds, SIGKILL the rest."""
    for process in processes:
        _signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in processes:
        while process_group_alive(process) and time.monotonic() < deadline:
            time.sleep(0.1)
        if process_group_alive(process):
            _signal_group(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)


def process_group_alive(process: subprocess.Popen[bytes]) -> bool:
    """Whether any process of the group led by ``process`` is left (reaping the leader first)."""
    process.poll()
    try:
        os.killpg(process.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def run_merged_output(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout: float,
    on_line: Callable[[str], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command to its end with stdout and stderr merged, like ``subprocess.run``, watching its output.

    ``on_line`` sees every output line as it is printed, from a reader thread, so a test can act
    at a given moment of the run (for example once a task has deferred). After ``timeout``
    seconds the process is killed and ``subprocess.TimeoutExpired`` raised.
    """
    process = subprocess.Popen(
        list(args), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        returncode = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    finally:
        reader.join(timeout=10)
    return subprocess.CompletedProcess(list(args), returncode, "".join(lines))
