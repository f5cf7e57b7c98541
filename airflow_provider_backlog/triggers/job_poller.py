"""One poll of the metrics database per job and poll interval, however many deferred sensors
wait on that job in the triggerer.

Each deferred sensor used to poll for itself, so the database's load grew with the number of
sensors: ten sensors on one job read the same rows ten times a poll interval. All the
triggers of one triggerer process run in one event loop, so the triggers waiting on the same
(connection, job) subscribe to one ``JobPoller`` instead. It reads what its most demanding
subscriber needs (the most checkpoints), as often as the most impatient one asks (the
shortest interval), and hands every poll to each subscriber, which judges it by its own
expectation and its own start. The poller starts with its first subscriber and ends when the
last one leaves, by firing or by being cancelled; nothing of it is serialized, so triggers
resumed after a triggerer restart simply subscribe again.

Airflow's own shared streams (``BaseEventTrigger.shared_stream_key``) serve event-driven
scheduling and open the stream with the first trigger's arguments; a job's sensors need
the largest of their demands, which changes as they come and go.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook
from airflow_provider_backlog.hooks.metrics_poll import JobPoll, read_job

#: The longest wait between two tries while the database does not answer.
MAX_RETRY_DELAY_S = 30.0


def retry_delay(previous_s: float | None, interval_s: float) -> float:
    """The wait after a failed read: the poll interval after the first failure of a run,
    then twice the previous wait, up to ``MAX_RETRY_DELAY_S``."""
    if previous_s is None:
        return interval_s
    return min(2 * previous_s, MAX_RETRY_DELAY_S)


@dataclass(frozen=True)
class Poll:
    """One read, as every subscriber gets it.

    :param at: The UTC time just before the read: freshness is judged against it.
    :param checkpoints: How many checkpoints the read asked for.
    :param found: What the read found; None when it failed.
    :param error: Why it failed; None when it did not.
    :param next_in_s: The wait before the next read (longer after failures).
    """

    at: datetime
    checkpoints: int
    found: JobPoll | None
    error: Exception | None
    next_in_s: float


class Subscription:
    """One trigger's place at a job's poller: what it needs, and the latest poll for it.

    :param checkpoints: How many of the job's latest checkpoints it must see.
    :param interval_s: How often it wants a poll, in seconds.
    """

    def __init__(self, checkpoints: int, interval_s: float):
        self.checkpoints = checkpoints
        self.interval_s = interval_s
        self._latest: Poll | None = None
        self._arrived = asyncio.Event()

    def offer(self, poll: Poll) -> None:
        """Keep ``poll`` if it read enough checkpoints for this subscriber (one that joined
        while a smaller read was under way waits for the next)."""
        if poll.checkpoints >= self.checkpoints:
            self._latest = poll
            self._arrived.set()

    async def next(self) -> Poll:
        """The next poll made for this subscriber (the latest, if it fell behind)."""
        await self._arrived.wait()
        self._arrived.clear()
        assert self._latest is not None
        return self._latest


class JobPoller:
    """Reads one job for its subscribers, in a task of the running event loop, while it has
    any.

    :param read: Reads the job's given number of latest checkpoints, lease and clock;
        blocking (it runs in a thread).
    :param ended: Called once the last subscriber has left and no read is under way (a
        thread cannot be cancelled: the read it runs still uses the connections).
    """

    def __init__(self, read: Callable[[int], JobPoll], ended: Callable[[], None]):
        self._read = read
        self._ended = ended
        self._subscribers: set[Subscription] = set()
        self._task: asyncio.Task[None] | None = None
        # The thread of a read outlives a cancelled poll (and the event loop, at a
        # triggerer's shutdown): the last of the poll and its read to finish ends the poller.
        self._lock = threading.Lock()
        self._reading = False
        self._stopping = False

    def subscribe(self, checkpoints: int, interval_s: float) -> Subscription:
        if self._stopping:
            raise RuntimeError("this poller has stopped: subscribe to a new one")
        subscription = Subscription(checkpoints, interval_s)
        self._subscribers.add(subscription)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._poll())
            self._task.add_done_callback(lambda _task: self._stopped())
        return subscription

    def unsubscribe(self, subscription: Subscription) -> bool:
        """Leave; True if it was the last subscriber, which stops the poller for good."""
        self._subscribers.discard(subscription)
        if self._subscribers or self._task is None:
            return False
        self._task.cancel()
        self._task = None
        return True

    def _stopped(self) -> None:
        with self._lock:
            self._stopping = True
            last = not self._reading
        if last:
            self._ended()

    def _read_in_thread(self, checkpoints: int) -> JobPoll:
        try:
            return self._read(checkpoints)
        finally:
            with self._lock:
                self._reading = False
                last = self._stopping
            if last:
                self._ended()

    async def _poll(self) -> None:
        failed_delay_s: float | None = None
        while self._subscribers:
            checkpoints = max(s.checkpoints for s in self._subscribers)
            interval_s = min(s.interval_s for s in self._subscribers)
            at = datetime.now(UTC)
            with self._lock:
                self._reading = True
            try:
                reading = asyncio.get_running_loop().run_in_executor(
                    None, self._read_in_thread, checkpoints
                )
            except RuntimeError:  # the loop is closing: no thread takes the read
                with self._lock:
                    self._reading = False
                return
            try:
                found = await reading
            except Exception as error:
                failed_delay_s = retry_delay(failed_delay_s, interval_s)
                poll = Poll(at, checkpoints, None, error, failed_delay_s)
            else:
                failed_delay_s = None
                poll = Poll(at, checkpoints, found, None, interval_s)
            for subscription in self._subscribers:
                subscription.offer(poll)
            await asyncio.sleep(poll.next_in_s)


#: Per event loop (the triggerer has one), the pollers by (connection id, job name).
_pollers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str], JobPoller]]
_pollers = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def subscribed(
    metrics_conn_id: str, job_name: str, checkpoints: int, interval_s: float
) -> Iterator[Subscription]:
    """A subscription to the job's poller in the running event loop, started if it is the
    first; leaving the block (also by cancellation) unsubscribes, and the last one out ends
    the poller, which closes its database connections once a read under way has ended."""
    pollers = _pollers.setdefault(asyncio.get_running_loop(), {})
    key = (metrics_conn_id, job_name)
    poller = pollers.get(key)
    if poller is None:
        hook = BacklogMetricsHook(metrics_conn_id)

        def read(count: int) -> JobPoll:
            return read_job(hook, job_name, count)

        def ended() -> None:
            if "engine" in hook.__dict__:  # it connected: close its pooled connections
                hook.engine.dispose()

        poller = pollers[key] = JobPoller(read, ended)
    subscription = poller.subscribe(checkpoints, interval_s)
    try:
        yield subscription
    finally:
        # A trigger that comes while the last read ends starts a poller of its own.
        if poller.unsubscribe(subscription) and pollers.get(key) is poller:
            del pollers[key]
