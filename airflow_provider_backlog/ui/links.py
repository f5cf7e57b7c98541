"""Where the pages link to, as the browser sees them: under the path the app is mounted at,
with the metrics connection the page was read from, so that a link never switches the
reader to another database."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, urlencode


@dataclass(frozen=True)
class Links:
    """The links of pages read from one metrics connection.

    :param root: The path the app is mounted at, e.g. ``/backlog`` (a trailing ``/`` is
        ignored; empty when it is mounted at the server's root).
    :param conn_id: The ``backlog_metrics`` connection the pages read.
    """

    root: str
    conn_id: str

    def jobs(self) -> str:
        """The page of every job."""
        return f"{self.root.rstrip('/')}/?{urlencode({'conn_id': self.conn_id})}"

    def job(self, job_name: str, **query: str) -> str:
        """A job's page; ``query`` may name ``start`` and ``end`` (ISO times) or a
        ``run_id``."""
        parameters = urlencode({"conn_id": self.conn_id, **query})
        return f"{self.root.rstrip('/')}/jobs/{quote(job_name, safe='')}?{parameters}"
