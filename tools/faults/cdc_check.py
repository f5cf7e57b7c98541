"""The CDC pipeline's raw change stream and merged copy against the source table, counted.

A SIGKILL, a server restart or a replayed batch must neither lose a change nor emit one twice,
and a count says how bad a failure is where an assertion stops at the first one: the fault
campaign reports the counts, the pipeline's tests assert they are zero. The table is an
accounts table of ``tools.data.cdc_data``, whose writer adds one to a row's ``version`` on every
write, so per key the versions in the stream run on from its first change without a gap.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from spark_jobs.jobs.merge_sink import written_batches
from tools.data.cdc_data import Account
from tools.pipelines.cdc_runs import Exactness, compare

Change = Mapping[str, Any]
KEY = "id"
#: What a key's first change must be: the rest only change a row the stream already holds.
FIRST_OPS = ("snapshot", "insert")
#: Problems described in a check, at most: enough to diagnose, short enough to print.
EXAMPLES = 10


@dataclass(frozen=True)
class StreamCheck:
    """Counts over one stream: ``lost`` versions (missing between a key's first and last
    change, a key's first change that is not its snapshot image or insert, a final version or
    a delete of the table's that never came), ``duplicated`` changes (a position or a key's
    version seen twice), and keys where the merged copy or the stream is not the source table:
    replayed, or read in order (a change after the key's delete, or a snapshot image after
    its first change; the writer never hands out an id twice). ``examples`` describes a few
    of the problems."""

    rows: int
    versions: int
    lost: int
    duplicated: int
    copy_differs: int
    stream_differs: int
    examples: tuple[str, ...] = ()

    @property
    def exact(self) -> bool:
        return not (self.lost or self.duplicated or self.copy_differs or self.stream_differs)


def read_changes(output: Path | str) -> list[dict[str, Any]]:
    """The change rows of every batch of a ``--changes-output`` directory written whole."""
    batches = [ds.dataset(d, format="parquet") for d in written_batches(str(output)).values()]
    return ds.dataset(batches).to_table().to_pylist() if batches else []


def check_changes(
    changes: Sequence[Change], source: Mapping[int, Account], copy: Mapping[int, Account]
) -> StreamCheck:
    """``changes`` (``read_changes``) and the merged ``copy`` against the ``source`` table's
    rows (``tools.data.cdc_data.table_rows``), read once the job stopped with nothing left."""
    by_key: dict[int, list[Change]] = defaultdict(list)
    for change in changes:
        by_key[change[KEY]].append(change)
    lost = duplicated = 0
    examples: list[str] = []
    unique: list[Change] = []
    versions: dict[int, set[int]] = {}
    misordered = 0
    for key, rows in by_key.items():
        rows.sort(key=_position)
        once = list({_position(r): r for r in rows}.values())
        marks = [r["version"] if r["_op"] != "delete" else "deleted" for r in once]
        seen = {m for m in marks if m != "deleted"}
        twice = len(rows) - len(once) + len(marks) - len(set(marks))
        missing = (max(seen) - min(seen) + 1 - len(seen) if seen else 0) + (
            once[0]["_op"] not in FIRST_OPS
        )
        out_of_order = _out_of_order(once)
        if twice or missing or out_of_order:
            examples.append(f"key {key}: {_show(rows)}")
        misordered += out_of_order
        duplicated, lost = duplicated + twice, lost + missing
        unique += once
        versions[key] = seen
    for key, account in source.items():
        if account.version not in versions.get(key, ()):
            lost += 1
            came = _show(by_key.get(key, []))
            examples.append(f"key {key}: version {account.version} never came: {came}")
    for key, rows in by_key.items():
        if key not in source and rows[-1]["_op"] != "delete":
            lost += 1
            examples.append(f"key {key}: its delete never came: {_show(rows)}")
    stream = compare(source, replay(unique))
    merged = compare(source, copy)
    for name, found in (("replayed stream", stream), ("merged copy", merged)):
        if not found.exact:
            examples.append(f"the {name}: {found.verdict()}")
    return StreamCheck(
        rows=len(source),
        versions=sum(len(v) for v in versions.values()),
        lost=lost,
        duplicated=duplicated,
        copy_differs=_keys(merged),
        stream_differs=_keys(stream) + misordered,
        examples=tuple(examples[:EXAMPLES]),
    )


def replay(changes: Sequence[Change]) -> dict[int, Account]:
    """The rows the changes leave, applied in stream order. A column an update left
    unchanged (``_unchanged``) keeps the key's value; a row with no value to keep (a key
    move's insert) never comes: the source reads such a row again."""
    rows: dict[int, dict[str, Any]] = {}
    for change in sorted(changes, key=_position):
        key = change[KEY]
        if change["_op"] == "delete":
            rows.pop(key, None)
            continue
        before = rows.get(key, {})
        values = {column: change[column] for column in Account._fields}
        for column in change.get("_unchanged") or ():
            values[column] = before.get(column)
        rows[key] = values
    return {key: Account(**values) for key, values in rows.items()}


def kinds_seen(changes: Sequence[Change]) -> dict[str, int]:
    """Change rows per ``_op``, and ``pairs``: transactions that updated exactly two keys
    (the writer's far-apart pairs), to tell that a stream was not trivial."""
    counts = Counter(change["_op"] for change in changes)
    updated: dict[int, set[int]] = defaultdict(set)
    for change in changes:
        if change["_op"] == "update":
            updated[change["_lsn"]].add(change[KEY])
    counts["pairs"] = sum(len(keys) == 2 for keys in updated.values())
    return dict(counts)


def _out_of_order(once: Sequence[Change]) -> bool:
    """A key's changes, in stream order, that no history of one row gives: a change after
    its delete, or a snapshot image after its first change."""
    ops = [change["_op"] for change in once]
    return "delete" in ops[:-1] or "snapshot" in ops[1:]


def _position(change: Change) -> tuple[int, int]:
    return change["_lsn"], change["_seq"]


def _keys(found: Exactness) -> int:
    return found.missing + found.extra + found.different


def _show(rows: Sequence[Change]) -> list[tuple]:
    return [(r["_op"], r["version"], r["_lsn"], r["_seq"]) for r in rows]
