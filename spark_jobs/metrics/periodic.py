"""The driver's background work (the metrics writer, the lease's renewal, the control
poller) runs on threads that must not die: a thread that ends on an unexpected exception
leaves its work undone without a word (requests claimed and never answered, a lease never
renewed). ``PeriodicThread`` runs one step at a time, logs whatever a step raises, and goes
on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class PeriodicThread:
    """Calls ``step`` on a daemon thread until stopped. ``step`` returns how long to wait
    before the next call; ``wake`` cuts the current wait short."""

    def __init__(self, name: str, step: Callable[[], float], first_delay_s: float = 0.0):
        self._step = step
        self._first_delay_s = first_delay_s
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Ask the thread to end after its current step; True if it has ended."""
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        delay = self._first_delay_s
        while True:
            self._wake.wait(delay)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                delay = self._step()
            except Exception:
                logger.exception("%s: a step failed unexpectedly; going on", self._thread.name)
                delay = 1.0
