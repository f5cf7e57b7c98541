import time
from datetime import UTC, datetime, timedelta

import pandas as pd
from confluent_kafka import Producer

from tools.data.verify import compare, topic_values, windows
from tools.services.broker import EmbeddedBroker

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def events(count: int) -> pd.DataFrame:
    """One event per second for two accounts, amounts 1, 2, 3..."""
    return pd.DataFrame(
        {
            "event_id": range(count),
            "account": [f"acct-{i % 2}" for i in range(count)],
            "amount": [float(i + 1) for i in range(count)],
            "event_time": [T0 + timedelta(seconds=i) for i in range(count)],
        }
    )


def test_a_sink_equal_to_the_recomputation_is_exactly_once_and_counts_what_it_compared():
    produced = events(40)
    # The watermark closed the first three 10 s windows; the last is still open.
    output = windows(produced, 10).iloc[:6]
    result = compare(output, produced, 10, T0 + timedelta(seconds=30))
    assert (result.exactly_once, result.produced, result.compared) == (True, 40, 30)


def test_missing_and_doubled_windows_count_their_events_as_lost_and_duplicated():
    produced = events(40)
    complete = windows(produced, 10).iloc[:6]
    output = pd.concat([complete.iloc[1:], complete.iloc[[2]]])
    result = compare(output, produced, 10, T0 + timedelta(seconds=30))
    assert (result.lost, result.duplicated, result.wrong_amounts) == (5, 5, 0)


def test_a_window_with_the_right_count_but_another_amount_is_wrong():
    produced = events(20)
    output = windows(produced, 10)
    output.loc[0, "amount"] += 1
    result = compare(output, produced, 10, T0 + timedelta(seconds=20))
    assert (result.lost, result.duplicated, result.wrong_amounts) == (0, 0, 1)


def test_every_value_of_the_topic_is_read_once_without_waiting_for_more(tmp_path):
    with EmbeddedBroker(tmp_path / "broker", {"events": 4}) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
        sent = [f"value-{i}".encode() for i in range(12_345)]  # more than one read's batch
        for i, value in enumerate(sent):
            producer.produce("events", value=value, partition=i % 4)
            producer.poll(0)
        assert producer.flush(30) == 0
        started = time.monotonic()
        values = topic_values(broker.bootstrap_servers, "events")
        took_s = time.monotonic() - started
    assert sorted(values) == sorted(sent)
    # The last read asks for what is left, so it does not wait out its 10 s timeout.
    assert took_s < 10, took_s
