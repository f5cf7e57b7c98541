"""The throwaway PostgreSQL server of ``tools.services.postgres`` for tests: where PostgreSQL is not
installed, a test that needs it skips on a developer's machine and fails under ``CI=true``
rather than erroring."""

from __future__ import annotations

from pathlib import Path

from tests.support.prerequisites import missing
from tools.services import postgres
from tools.services.postgres import LOGICAL_DECODING, find_bin_dir, free_port

__all__ = ["LOGICAL_DECODING", "RELEASES", "PostgresServer", "find_bin_dir", "free_port"]

#: The releases the CDC source supports beside the installed one (Debian 12's 15), where
#: scripts/install-postgres-releases puts them; None is the installed one.
RELEASES: tuple[str | None, ...] = (None, "17", "18")
_RELEASES_DIR = Path(__file__).resolve().parents[2] / ".venv" / "postgres"


def release_bin_dir(release: str | None) -> Path | None:
    """Where ``release``'s server binaries are (None: the installed release, found on start)."""
    return None if release is None else _RELEASES_DIR / release / "bin"


class PostgresServer(postgres.PostgresServer):
    """``tools.services.postgres.PostgresServer`` that skips the test when PostgreSQL is missing."""

    def start(self) -> PostgresServer:
        try:
            super().start()
        except postgres.PostgresUnavailable as unavailable:
            hint = "" if self._bin is None else " (scripts/install-postgres-releases)"
            missing(f"{unavailable}{hint}; needed to run these tests")
        return self
