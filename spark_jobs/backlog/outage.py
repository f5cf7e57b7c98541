"""How long a dependency has been failing, so that a short outage is ridden out and a long
one fails by name.

Brokers restart and partition leaders move; Spark's own Kafka source retries its offset
fetches rather than end the query at the first refusal. A run of failures begins at the
first failure and ends at the next success; the clock is injected, so the rule is tested
without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Outage:
    """Failures of one dependency, tolerated for ``timeout_s`` from the first of a run."""

    timeout_s: float
    clock: Callable[[], float] = time.monotonic
    _since: float | None = field(default=None, init=False)

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    @property
    def lasted_s(self) -> float:
        """How long the current run of failures has lasted (0 without one)."""
        return 0.0 if self._since is None else self.clock() - self._since

    def failed(self) -> bool:
        """Note a failure; True while the run of failures is still within ``timeout_s``."""
        if self._since is None:
            self._since = self.clock()
        return self.lasted_s <= self.timeout_s

    def recovered(self) -> float | None:
        """Note a success; how long the run of failures it ends lasted, None if none."""
        if self._since is None:
            return None
        lasted = self.lasted_s
        self._since = None
        return lasted
