"""The StreamingQueryListener that feeds one query's progress to its coordinator."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from spark_jobs.coordinator.progress import BatchProgress

logger = logging.getLogger(__name__)


class ProgressListener(StreamingQueryListener):
    """Hands progress of the query named ``query_name`` to ``on_progress``.

    Spark calls listeners on its listener-bus thread; an exception here would only be
    logged by Spark, so we log it ourselves and carry on. Restarts keep the query name,
    so one listener serves every run of the query.
    """

    def __init__(self, query_name: str, on_progress: Callable[[BatchProgress], Any]):
        self._query_name = query_name
        self._on_progress = on_progress

    def onQueryStarted(self, event: Any) -> None:
        del event

    def onQueryProgress(self, event: Any) -> None:
        try:
            progress = BatchProgress.from_json(event.progress.json)
            if progress.name == self._query_name:
                self._on_progress(progress)
        except Exception:
            logger.exception("backlog coordinator failed on a progress event; the query goes on")

    def onQueryIdle(self, event: Any) -> None:
        del event

    def onQueryTerminated(self, event: Any) -> None:
        del event
