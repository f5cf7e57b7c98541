"""Whether a database error says the server is away rather than that a statement is wrong.

The CDC source rides out a source server that restarts or fails over, and the merge waits for
a target that does the same, each for its own timeout (``backlog.outage.Outage`` keeps the
time); both ask the driver's error the same question here, where the pure rules need not
know the drivers.
"""

from __future__ import annotations

import sqlalchemy

#: SQLSTATEs of a server going away: admin shutdown, crash shutdown, cannot connect now.
_GOING_AWAY = ("57P01", "57P02", "57P03")


def is_outage(error: Exception) -> bool:
    """Whether ``error`` says the server is away (refused, cut, shutting down, restarting)
    rather than that a statement is wrong: such an outage is ridden out, not failed on.
    Connection errors (class 08) and errors that carry no SQLSTATE at all (a refused
    socket) count."""
    if not isinstance(error, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
        return False
    code = sqlstate(error)
    return code is None or code.startswith("08") or code in _GOING_AWAY


def sqlstate(error: sqlalchemy.exc.DBAPIError) -> str | None:
    """The SQLSTATE of a PostgreSQL error, from psycopg 3 or psycopg2 alike."""
    return getattr(error.orig, "sqlstate", None) or getattr(error.orig, "pgcode", None)
