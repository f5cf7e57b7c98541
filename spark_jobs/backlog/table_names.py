"""A table's name as users give it on a command line: ``name`` or ``schema.name``.

One rule for the job and for the Airflow side that names what the job reads: parts are
split at dots, and a part in double quotes keeps its dots (``sales."q1.2026"``), a doubled
quote inside standing for one, as in SQL. A part is otherwise taken as written, case and
all (``Orders`` is not ``orders``), which is how PostgreSQL's own tools take a name given
to them already quoted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class TableNameError(ValueError):
    """A name that does not split into parts; the message names it and the rule."""


def split_table_name(name: str) -> tuple[str, ...]:
    """The parts of ``name``: one (the table) or two (its schema, then the table)."""
    parts: list[str] = []
    current, quoted, index = "", False, 0
    while index < len(name):
        char = name[index]
        if quoted:
            if char == '"' and name[index + 1 : index + 2] == '"':
                current, index = current + '"', index + 2
                continue
            if char == '"':
                quoted = False
                if index + 1 < len(name) and name[index + 1] != ".":
                    raise _error(name, "a quoted part must end at a dot or at the end")
            else:
                current += char
        elif char == '"' and not current:
            quoted = True
        elif char == ".":
            parts.append(current)
            current = ""
        else:
            current += char
        index += 1
    if quoted:
        raise _error(name, "a double quote is not closed")
    parts.append(current)
    if not all(parts) or len(parts) > 2:
        raise _error(name, "it must be 'table' or 'schema.table', with no empty part")
    return tuple(parts)


def as_part(part: str) -> str:
    """One part written so that ``split_table_name`` takes it back whole: in double quotes
    when it holds a dot or a quote."""
    if "." in part or '"' in part:
        return '"' + part.replace('"', '""') + '"'
    return part


def qualified(name: str, quote: Callable[[str], str]) -> str:
    """``name`` for SQL, each part quoted by ``quote`` (a dialect's identifier quoting)."""
    return ".".join(quote(part) for part in split_table_name(name))


def in_text(sql: str) -> str:
    """SQL (a quoted name, a table's expression) as it goes into ``text()``, which would take
    a ``:word`` inside its quotes for a bound parameter."""
    return sql.replace(":", "\\:")


def text_quoting(preparer: Any) -> Callable[[str], str]:
    """A dialect's quoting of a name (``preparer``: its ``identifier_preparer``) for SQL that
    SQLAlchemy renders itself (``text()``) or that goes as a bound value: in quotes where the
    dialect needs them, a '%' left single. The preparer's own ``quote`` doubles a '%' for
    drivers that take it for a placeholder, as ``text()`` then does again."""

    def quote(part: str) -> str:
        return part if preparer.quote(part) == part else '"' + part.replace('"', '""') + '"'

    return quote


def _error(name: str, rule: str) -> TableNameError:
    return TableNameError(
        f"table name {name!r}: {rule}; a part holding a dot goes in double quotes, as in "
        'sales."q1.2026"'
    )
