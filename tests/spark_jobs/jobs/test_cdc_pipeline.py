import uuid

import pytest

from spark_jobs.jobs.cdc_pipeline import (
    SOURCE_NAME,
    check_launched_shape,
    parse_args,
    source_state,
)
from spark_jobs.metrics.schema import make_engine
from spark_jobs.sources.cdc.child import PostgresCdcChild
from spark_jobs.sources.cdc.connection import describe
from spark_jobs.sources.children import ChildSpecError
from spark_jobs.storage.files import StateDirectory, resolve_uri

SOURCE = ["--connection", "postgresql://reader@db/shop", "--table", "accounts"]
CHECKPOINT = ["--checkpoint", "/c"]


def test_a_target_a_changes_output_or_both():
    merged = parse_args([*SOURCE, *CHECKPOINT, "--target", "sqlite:////t.db"])
    assert (merged.target, merged.changes_output) == ("sqlite:////t.db", None)
    assert (merged.start_over, merged.target_outage_timeout) == (False, 120.0)
    raw = parse_args([*SOURCE, *CHECKPOINT, "--changes-output", "/out"])
    assert (raw.target, raw.changes_output) == (None, "/out")
    both = parse_args(
        [*SOURCE, *CHECKPOINT, "--target", "sqlite:////t.db", "--changes-output", "/out",
         "--start-over", "--target-outage-timeout", "30s"]
    )  # fmt: skip
    assert (both.target, both.changes_output, both.start_over) == ("sqlite:////t.db", "/out", True)
    assert both.target_outage_timeout == 30.0
    assert parse_args([*SOURCE, *CHECKPOINT, "--teardown"]).teardown


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "one of --target and --changes-output is required (unless --teardown)"),
        (["--changes-output", "/out", "--target-table", "t"], "--target-table needs --target"),
        (["--changes-output", "/out", "--start-over"], "--start-over needs --target"),
        (["--target", "sqlite:////t.db", "--chunk-rows", "0"], "expected a whole number above 0"),
        (["--target", "sqlite:////t.db", "--static-max-rows", "9"], "needs --static-trigger"),
        (["--target", "sqlite:////t.db", "--conf", "spark.x"], "expected KEY=VALUE"),
    ],
)
def test_bad_arguments_are_refused_by_name(capsys, extra, message):
    with pytest.raises(SystemExit) as exit_:
        parse_args([*SOURCE, *CHECKPOINT, *extra])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_table_changed_while_a_first_run_starts_fails_it_by_name(postgres_server, tmp_path):
    """The run's target and stream take the table as the run read it at launch; the source
    keeps it as its first plan reads it, seconds later. A new key in between would have
    merged the copy by the old one, and left its column out, without a word."""
    url, table = postgres_server.url, f"launched_{uuid.uuid4().hex[:8]}"
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.exec_driver_sql(f"CREATE TABLE {table} (id int PRIMARY KEY, name text)")
    args = parse_args(
        ["--connection", url, "--table", table, "--checkpoint", str(tmp_path / "checkpoint"),
         "--target", f"sqlite:///{tmp_path / 'copy.db'}"]
    )  # fmt: skip
    launched = describe(SOURCE_NAME, url, table)
    with engine.begin() as connection:
        connection.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN extra_key serial")
        connection.exec_driver_sql(
            f"ALTER TABLE {table} DROP CONSTRAINT {table}_pkey, ADD PRIMARY KEY (extra_key)"
        )
    engine.dispose()
    copied = describe(SOURCE_NAME, url, table)
    state = StateDirectory(f"{resolve_uri(source_state(args))}/{SOURCE_NAME}")
    state.write(PostgresCdcChild.SHAPE, {"table": copied.signature()})

    with pytest.raises(ChildSpecError) as raised:
        check_launched_shape(args, launched)
    message = str(raised.value)
    assert message.startswith(
        f"child source 'cdc': table public.{table} changed between this run's start and its "
        "copy's: "
    )
    assert "its primary key is ['extra_key'], not ['id']" in message
    assert message.endswith("run the job again: the copy began with the table as it is now")
    check_launched_shape(args, copied)  # the run started again reads the table as copied
