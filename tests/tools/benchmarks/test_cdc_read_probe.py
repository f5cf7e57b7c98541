"""The CDC probe's ways read the same table whole and write every row of it, on real
PostgreSQL servers."""

import pytest

from spark_jobs.metrics.schema import make_engine
from spark_jobs.sources.cdc.describe import describe_table
from tests.support.postgres import LOGICAL_DECODING, PostgresServer
from tools.benchmarks.cdc_read_probe import (
    TABLE,
    copy_into_arrow,
    copy_into_target,
    merge_into_target,
    parse_args,
    read_chunks,
)
from tools.data.cdc_data import create_accounts, table_rows


def test_every_way_reads_or_writes_every_row_of_the_table(tmp_path):
    with PostgresServer(database="shop", settings=LOGICAL_DECODING) as server:
        create_accounts(server.url, TABLE, 2_500)
        assert copy_into_arrow(server.url, 1_000) == 2_500
        assert read_chunks(server.url, 1_000, tmp_path) == 2_500
        # A table of whole chunks ends with an empty one.
        assert copy_into_arrow(server.url, 500) == 2_500
        engine = make_engine(server.url)
        shape = describe_table(engine, TABLE)
        engine.dispose()
        assert copy_into_target(server.url, "plain", shape, tmp_path) == 2_500
        assert merge_into_target(server.url, "merged", shape, tmp_path) == 2_500
        # The copies hold the table's rows exactly.
        assert table_rows(server.url, "plain") == table_rows(server.url, TABLE)
        assert table_rows(server.url, "merged") == table_rows(server.url, TABLE)


def test_counts_below_one_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--chunk-rows", "0"])
    assert "--chunk-rows must be at least 1" in capsys.readouterr().err
