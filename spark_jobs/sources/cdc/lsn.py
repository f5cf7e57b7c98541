"""PostgreSQL log sequence numbers (LSNs) as ints.

PostgreSQL prints an LSN as two hex halves, ``'16/B374D848'``: the high and low 32 bits of
a byte position in the WAL. As ints they order as the WAL does, compare without parsing
and fit an offset's JSON; text is only for talking to the server and to people.
"""

from __future__ import annotations

import re

MAX_LSN = 2**64 - 1
_LSN_TEXT = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")


def parse_lsn(text: str) -> int:
    """``'16/B374D848'`` as an int; a ValueError names anything else."""
    match = _LSN_TEXT.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(
            f"not a PostgreSQL LSN: {text!r}; expected two hex numbers of 1 to 8 digits "
            "separated by '/', as '16/B374D848'"
        )
    return int(match[1], 16) << 32 | int(match[2], 16)


def format_lsn(lsn: int) -> str:
    """``lsn`` as PostgreSQL prints it: upper-case hex halves without leading zeros."""
    if isinstance(lsn, bool) or not isinstance(lsn, int) or not 0 <= lsn <= MAX_LSN:
        raise ValueError(f"not a PostgreSQL LSN: {lsn!r}; expected an int from 0 to 2**64 - 1")
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"
