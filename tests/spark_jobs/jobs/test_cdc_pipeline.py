import pytest

from spark_jobs.jobs.cdc_pipeline import parse_args

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
