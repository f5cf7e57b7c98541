"""The StreamingQueryListener that feeds one query's progress to its coordinator.

PySpark hands a Python listener each event rebuilt field by field through Py4J (every
source, sink, state operator and metric one call to the JVM and back), which the
coordinator then read as the progress's JSON: about half of a driver's Python time in
a run of short batches, and the JVM's Py4J threads' as much again. The listener asks
Spark for that JSON instead, in one call per batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

from pyspark import SparkContext
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
        self._java: Any = None

    @property
    def _jlistener(self) -> Any:
        """What ``addListener`` and ``removeListener`` register: Spark's wrapper around the
        calls below, made once."""
        if self._java is None:
            assert SparkContext._jvm is not None, "no SparkContext is running"
            streaming = SparkContext._jvm.org.apache.spark.sql.streaming
            self._java = streaming.PythonStreamingQueryListenerWrapper(_SparkCalls(self))
        return self._java

    def on_progress_json(self, progress_json: str) -> None:
        try:
            progress = BatchProgress.from_json(progress_json)
            if progress.name == self._query_name:
                self._on_progress(progress)
        except Exception:
            logger.exception("backlog coordinator failed on a progress event; the query goes on")

    def onQueryStarted(self, event: Any) -> None:
        del event

    def onQueryProgress(self, event: Any) -> None:
        self.on_progress_json(event.progress.json)

    def onQueryIdle(self, event: Any) -> None:
        del event

    def onQueryTerminated(self, event: Any) -> None:
        del event


class _SparkCalls:
    """The Java listener interface, implemented through Py4J: a progress event read as
    Spark's JSON of it in one call; the other events are of no use to the coordinator."""

    def __init__(self, listener: ProgressListener):
        self._listener = listener

    def onQueryStarted(self, jevent: Any) -> None:
        del jevent

    def onQueryProgress(self, jevent: Any) -> None:
        self._listener.on_progress_json(jevent.progress().json())

    def onQueryIdle(self, jevent: Any) -> None:
        del jevent

    def onQueryTerminated(self, jevent: Any) -> None:
        del jevent

    class Java:
        implements: ClassVar[list[str]] = [
            "org.apache.spark.sql.streaming.PythonStreamingQueryListener"
        ]
