"""Waiting for an Airflow api-server the tests started, and stopping it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx


def wait_until_healthy(server: subprocess.Popen, url: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the api-server exited:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/api/v2/monitor/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"no healthy api-server in {timeout_s:.0f} s:\n{log.read_text()[-4000:]}")


def stop(server: subprocess.Popen) -> None:
    """Its whole process group: the api-server runs its worker in a child process."""
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)
