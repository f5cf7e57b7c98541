"""Polling the metrics database from the triggerer, so a waiting sensor holds no worker slot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook, Expectation


class JobExpectationTrigger(BaseTrigger):
    """Fires once the job's latest checkpoints meet the expectation; fires an error event
    (which fails the task, naming the cause) if the job's driver died or its run ended after
    ``since`` (ISO time the wait began), or if the database cannot be read."""

    def __init__(
        self,
        metrics_conn_id: str,
        job_name: str,
        expectation: dict[str, Any],
        poll_interval_s: float,
        since: str,
    ):
        super().__init__()
        self.metrics_conn_id = metrics_conn_id
        self.job_name = job_name
        self.expectation = Expectation(**expectation)
        self.poll_interval_s = poll_interval_s
        self.since = since

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "metrics_conn_id": self.metrics_conn_id,
                "job_name": self.job_name,
                "expectation": asdict(self.expectation),
                "poll_interval_s": self.poll_interval_s,
                "since": self.since,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = BacklogMetricsHook(self.metrics_conn_id)
        since = datetime.fromisoformat(self.since)
        while True:
            now = datetime.now(UTC)
            try:
                snapshot = await asyncio.to_thread(
                    hook.job_snapshot, self.job_name, self.expectation.checkpoints
                )
                stopped = await asyncio.to_thread(hook.run_stopped, self.job_name, since)
            except Exception as error:
                yield TriggerEvent(
                    {
                        "status": "error",
                        "message": f"cannot read the metrics of job {self.job_name!r} "
                        f"through connection {self.metrics_conn_id!r}: {error}",
                    }
                )
                return
            if self.expectation.met_by(snapshot, now):
                assert snapshot is not None
                yield TriggerEvent({"status": "success", "snapshot": snapshot.as_dict()})
                return
            if stopped is not None:
                yield TriggerEvent({"status": "error", "message": stopped})
                return
            await asyncio.sleep(self.poll_interval_s)
