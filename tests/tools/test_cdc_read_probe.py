"""The CDC read probe's two ways read the same table whole, on a real PostgreSQL."""

import pytest

from tests.support.postgres import LOGICAL_DECODING, PostgresServer
from tests.tools.commands import assert_script_runs_module
from tools.cdc_data import create_accounts
from tools.cdc_read_probe import TABLE, copy_into_arrow, parse_args, read_chunks


def test_both_ways_read_every_row_of_the_table(tmp_path):
    with PostgresServer(database="shop", settings=LOGICAL_DECODING) as server:
        create_accounts(server.url, TABLE, 2_500)
        assert copy_into_arrow(server.url, 1_000) == 2_500
        assert read_chunks(server.url, 1_000, tmp_path) == 2_500
        # A table of whole chunks ends with an empty one.
        assert copy_into_arrow(server.url, 500) == 2_500


def test_counts_below_one_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--chunk-rows", "0"])
    assert "--chunk-rows must be at least 1" in capsys.readouterr().err


def test_the_command_runs_the_module_from_the_checkout():
    assert_script_runs_module("cdc-read-benchmark", "cdc_read_probe", "scripts/cdc-read-benchmark")
