"""The throwaway PostgreSQL server of ``tools.services.postgres`` for tests: where PostgreSQL is not
installed, a test that needs it skips on a developer's machine and fails under ``CI=true``
rather than erroring."""

from __future__ import annotations

from tests.support.prerequisites import missing
from tools.services import postgres
from tools.services.postgres import LOGICAL_DECODING, find_bin_dir, free_port

__all__ = ["LOGICAL_DECODING", "PostgresServer", "find_bin_dir", "free_port"]


class PostgresServer(postgres.PostgresServer):
    """``tools.services.postgres.PostgresServer`` that skips the test when PostgreSQL is missing."""

    def start(self) -> PostgresServer:
        try:
            super().start()
        except postgres.PostgresUnavailable as unavailable:
            missing(f"{unavailable}; needed to run these tests")
        return self
