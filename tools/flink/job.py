"""The events pipeline in PyFlink, as Apache Flink runs FLIP-309 natively: the peer that
tools/flink/peer.py measures ours against. It runs inside .venv-flink (scripts/flink-setup)
and imports only pyflink and the standard library, since that environment has nothing else.

A HybridSource reads the history (CSV: the apache-flink wheel has no parquet format) and
then monitors the landing directory (the JSON-lines files of tools/data/events.py's producer). Both
children read text lines; SQL parses either kind, so the whole pipeline stays in the JVM.
The aggregation is the events pipeline's: per account and 10 s event-time window, with a
10 s watermark, emitted once the window closes, into a file sink whose part files Flink
commits at each checkpoint (exactly once, as Spark's parquet sink commits at each batch).

It runs until killed; the driver reads its progress from Flink's log and REST API.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from pyflink.common import Configuration, Duration, Types, WatermarkStrategy
from pyflink.datastream import StreamExecutionEnvironment
from pyflink.datastream.connectors.file_system import FileSource, StreamFormat
from pyflink.datastream.connectors.hybrid_source import HybridSource
from pyflink.table import DataTypes, Schema, StreamTableEnvironment

#: The one physical column: a text line, either a history line
#: ``event_id,account,amount,event_time_ms`` or tools/data/events.py's live JSON object.
LINE = "f0"
IS_JSON = f"SUBSTRING({LINE}, 1, 1) = '{{'"
#: Each event column, read from either kind of line.
COLUMNS = {
    "event_id": f"CAST(IF({IS_JSON}, JSON_VALUE({LINE}, '$.event_id'), "
    f"SPLIT_INDEX({LINE}, ',', 0)) AS BIGINT)",
    "account": f"IF({IS_JSON}, JSON_VALUE({LINE}, '$.account'), SPLIT_INDEX({LINE}, ',', 1))",
    "amount": f"CAST(IF({IS_JSON}, JSON_VALUE({LINE}, '$.amount'), "
    f"SPLIT_INDEX({LINE}, ',', 2)) AS DOUBLE)",
    "event_time": f"IF({IS_JSON}, "
    f"CAST(REPLACE(REPLACE(JSON_VALUE({LINE}, '$.event_time'), 'T', ' '), 'Z', '') "
    "AS TIMESTAMP(3)), "
    f"CAST(TO_TIMESTAMP_LTZ(CAST(SPLIT_INDEX({LINE}, ',', 3) AS BIGINT), 3) AS TIMESTAMP(3)))",
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tools/flink/job.py", description=__doc__)
    parser.add_argument("--history", required=True, help="directory of CSV history files")
    parser.add_argument("--landing", required=True, help="directory JSON-lines files land in")
    parser.add_argument("--output", required=True, help="CSV output directory")
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory")
    parser.add_argument("--interval-ms", type=int, default=1000)
    parser.add_argument("--interval-during-backlog-ms", type=int, default=30_000)
    parser.add_argument("--monitor-interval-ms", type=int, default=100)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--window-s", type=int, default=10)
    parser.add_argument("--watermark-s", type=int, default=10)
    parser.add_argument("--rest-port", type=int, required=True)
    return parser.parse_args(argv)


def configuration(args: argparse.Namespace) -> Configuration:
    config = Configuration()
    for key, value in {
        "execution.checkpointing.interval": f"{args.interval_ms}ms",
        "execution.checkpointing.interval-during-backlog": f"{args.interval_during_backlog_ms}ms",
        "execution.checkpointing.dir": f"file://{args.checkpoint}",
        "state.backend.type": "rocksdb",
        "execution.checkpointing.incremental": "true",
        "parallelism.default": str(args.parallelism),
        # Flink's own advice for throughput: operators hand records on without copying them
        # (safe here: nothing keeps a record it has passed on).
        "pipeline.object-reuse": "true",
        "rest.port": str(args.rest_port),
        "rest.address": "127.0.0.1",
        # The driver reads checkpoints and record counts over REST while the job runs.
        "web.checkpoints.history": "10000",
        "metrics.fetcher.update-interval": "250",
        "table.local-time-zone": "UTC",
    }.items():
        config.set_string(key, value)
    return config


def hybrid_source(args: argparse.Namespace) -> HybridSource:
    history = FileSource.for_record_stream_format(
        StreamFormat.text_line_format(), args.history
    ).build()
    landing = (
        FileSource.for_record_stream_format(StreamFormat.text_line_format(), args.landing)
        .monitor_continuously(Duration.of_millis(args.monitor_interval_ms))
        .build()
    )
    return HybridSource.builder(history).add_source(landing).build()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    env = StreamExecutionEnvironment.get_execution_environment(configuration(args))
    tables = StreamTableEnvironment.create(env)
    lines = env.from_source(
        hybrid_source(args), WatermarkStrategy.no_watermarks(), "events", Types.STRING()
    )
    schema = Schema.new_builder().column(LINE, DataTypes.STRING())
    for name, expression in COLUMNS.items():
        schema = schema.column_by_expression(name, expression)
    schema = schema.watermark("event_time", f"event_time - INTERVAL '{args.watermark_s}' SECOND")
    tables.create_temporary_view("events", tables.from_data_stream(lines, schema.build()))
    tables.execute_sql(
        f"""CREATE TABLE totals (
            window_start TIMESTAMP(3), window_end TIMESTAMP(3), account STRING,
            events BIGINT, amount DOUBLE
        ) WITH ('connector' = 'filesystem', 'path' = 'file://{args.output}', 'format' = 'csv')"""
    )
    result = tables.execute_sql(
        f"""INSERT INTO totals
        SELECT window_start, window_end, account, COUNT(*), SUM(amount)
        FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(event_time), INTERVAL '{args.window_s}' SECOND))
        GROUP BY window_start, window_end, account"""
    )
    result.wait()


if __name__ == "__main__":
    main()
