"""A table copied by the postgres-cdc source into a merge target in this process, batch by batch
as Spark would run them (``tools.faults.micro_batches``): what the tests of the copy as a whole and
the randomized CDC campaign drive, without a JVM."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from spark_jobs.backlog.table_names import as_part, split_table_name
from spark_jobs.jobs.merge.target import MergeTarget
from spark_jobs.sources.cdc.child import PostgresCdcChild, default_slot_name
from spark_jobs.sources.cdc.connection import change_schema, describe, teardown
from spark_jobs.sources.hybrid import HybridStreamReader
from tools.faults.cdc_compare import compare
from tools.faults.micro_batches import MicroBatches, no_fault


class CdcCopy:
    """``table`` of ``source_url`` copied into ``target_url`` (``copy_of_<table>_<query>``)."""

    def __init__(
        self,
        source_url: str,
        table: str,
        target_url: str,
        state: Path,
        chunk_rows: int,
        fault: Callable[[str], None] = no_fault,
        **fields: Any,
    ):
        self.source_url, self.table, self.target_url = source_url, table, target_url
        self.state = state
        spec = {"name": "cdc", "kind": "postgres-cdc", "connection": source_url, "table": table}
        spec |= {"chunkRows": chunk_rows, **fields}
        self.options = {"sources": json.dumps([spec]), "stateLocation": str(state)}
        self.shape = describe("cdc", source_url, table)
        # A target table and a query of its own: copies of one table into one database
        # (tests of one server, trials of one campaign) never meet.
        self.query_id = uuid.uuid4().hex
        self.target_table = as_part(f"copy_of_{split_table_name(table)[-1]}_{self.query_id[:8]}")
        self.target = MergeTarget(target_url, self.target_table, self.shape, 10.0)
        #: As ``backlog-cdc-job --start-over`` merges.
        self.start_over = False
        self.batches = MicroBatches(self._reader, self._merge, fault)

    def retarget(self, target_table: str) -> None:
        """Merge from now on into ``target_table`` (``--target-table`` at a restart)."""
        self.target.close()
        self.target_table = target_table
        self.target = MergeTarget(self.target_url, target_table, self.shape, 10.0)

    def differences(self) -> list[str]:
        """The copy compared with the table as it is now, value by value: each difference
        described; empty when they are equal."""
        found = compare(self.source_url, self.table, self.target_url, self.target_table, self.shape)
        return [difference.describe(self.shape) for difference in found]

    def _reader(self) -> HybridStreamReader:
        return HybridStreamReader(self.options, from_arrow_schema(change_schema(self.shape)))

    def _merge(self, batch: int, rows) -> None:  # type: ignore[no-untyped-def]
        self.target.merge(rows, self.query_id, str(self.state), batch, self.start_over)

    @property
    def child(self) -> PostgresCdcChild:
        reader = self.batches.reader
        assert isinstance(reader, HybridStreamReader)
        child = reader.children[0]
        assert isinstance(child, PostgresCdcChild)
        return child

    def step(self, max_rows: int | None = None) -> bool:
        limit: ReadLimit = ReadAllAvailable() if max_rows is None else ReadMaxRows(max_rows)
        return self.batches.step(limit)

    @property
    def live(self) -> bool:
        last = self.batches.logs.last
        return last is not None and not self.batches.logs.offsets[last]["backlog"]

    @property
    def phases(self) -> list[bool]:
        """Per batch logged, whether it was backlog."""
        offsets = self.batches.logs.offsets
        return [offsets[batch]["backlog"] for batch in sorted(offsets)]

    def until_live_and_idle(self, max_rows: int | None = None, steps: int = 1_000) -> None:
        """Batches until one trigger finds nothing new with the copy live."""
        for _ in range(steps):
            if not self.step(max_rows) and self.batches.reader is not None and self.live:
                return
        raise AssertionError(f"not live and idle after {steps} triggers")

    def close(self) -> None:
        """Stop reading, drop the slot and its publication (whatever became of the table)."""
        self.batches.kill()
        slot = default_slot_name(str(self.state), "cdc")
        teardown(self.source_url, slot, slot, self.table)
        self.target.close()
