import pytest

from spark_jobs.backlog.config import (
    BacklogConfig,
    ConfigError,
    checkpoint_interval,
    reconfigured,
)
from spark_jobs.backlog.lag import LagRules, Thresholds

BASE = {"spark.backlog.job-name": "orders"}


def parse(**overrides: str) -> BacklogConfig:
    conf = dict(BASE)
    conf.update({f"spark.backlog.{k.replace('_', '-')}": v for k, v in overrides.items()})
    return BacklogConfig.from_spark_conf(conf)


def problems(conf: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as error:
        BacklogConfig.from_spark_conf({**BASE, **conf})
    assert str(error.value).startswith("invalid backlog configuration:")
    return error.value.problems


def test_defaults():
    config = BacklogConfig.from_spark_conf({}, app_name="my-app")
    assert config.interval_s == 30
    assert config.interval_during_backlog_s is None
    assert config.min_pause_s == 0
    assert config.max_batch_rows == 1_000_000
    assert config.job_name == "my-app"
    assert config.metrics_url == "sqlite:///backlog_metrics.db"
    assert len(config.run_id) == 32
    assert config.lag_rules == LagRules(offsets=None, watermark_s=None, min_dwell_s=0)
    assert config.metrics_retention_s is None


def test_reads_every_key():
    config = BacklogConfig.from_spark_conf(
        {
            "spark.backlog.checkpointing.interval": "2s",
            "spark.backlog.checkpointing.interval-during-backlog": "30min",
            "spark.backlog.checkpointing.min-pause": "500ms",
            "spark.backlog.checkpointing.max-batch-rows": "2_000_000",
            "spark.backlog.job-name": "orders",
            "spark.backlog.run-id": "manual__2026-11-21",
            "spark.backlog.metrics.url": "postgresql://u:p@127.0.0.1:5432/metrics",
            "spark.backlog.file-source.pending-files-threshold": "3",
            "spark.backlog.metrics.retention": "7d",
        }
    )
    assert (config.interval_s, config.interval_during_backlog_s, config.min_pause_s) == (
        2,
        1800,
        0.5,
    )
    assert config.max_batch_rows == 2_000_000
    assert (config.job_name, config.run_id) == ("orders", "manual__2026-11-21")
    assert config.metrics_url.startswith("postgresql://")
    assert config.pending_files_threshold == 3
    assert config.metrics_retention_s == 7 * 86400


def test_interval_during_backlog_zero_disables_periodic_checkpoints_in_backlog():
    config = BacklogConfig.from_spark_conf(
        {**BASE, "spark.backlog.checkpointing.interval-during-backlog": "0"}
    )
    assert checkpoint_interval(config, job_is_backlog=True) is None
    assert checkpoint_interval(config, job_is_backlog=False) == 30


def test_one_function_picks_the_interval():
    unset = parse()
    assert checkpoint_interval(unset, True) == checkpoint_interval(unset, False) == 30
    longer = BacklogConfig.from_spark_conf(
        {**BASE, "spark.backlog.checkpointing.interval-during-backlog": "10min"}
    )
    assert checkpoint_interval(longer, True) == 600
    assert checkpoint_interval(longer, False) == 30


def test_with_a_freshness_target_the_chosen_live_interval_replaces_interval():
    targeted = BacklogConfig.from_spark_conf(
        {
            **BASE,
            "spark.backlog.checkpointing.freshness-target": "5s",
            "spark.backlog.checkpointing.interval-during-backlog": "1min",
        }
    )
    assert targeted.freshness_target_s == 5.0
    assert checkpoint_interval(targeted, False, chosen_live_s=3.2) == 3.2
    assert checkpoint_interval(targeted, False) == 30  # nothing chosen yet
    assert checkpoint_interval(targeted, True, chosen_live_s=3.2) == 60
    assert checkpoint_interval(parse(), False, chosen_live_s=3.2) == 30  # no target


def test_a_freshness_target_no_longer_than_min_pause_is_refused():
    assert problems(
        {
            "spark.backlog.checkpointing.freshness-target": "2s",
            "spark.backlog.checkpointing.min-pause": "2s",
        }
    ) == [
        "spark.backlog.checkpointing.freshness-target = '2s' is invalid: it must be longer "
        "than spark.backlog.checkpointing.min-pause (2s), the least time between a commit and "
        "the next batch"
    ]


def test_backlog_interval_shorter_than_interval_is_refused_with_flinks_reason():
    [problem] = problems(
        {
            "spark.backlog.checkpointing.interval": "1min",
            "spark.backlog.checkpointing.interval-during-backlog": "10s",
        }
    )
    assert problem == (
        "spark.backlog.checkpointing.interval-during-backlog = '10s' is invalid: it must be 0 "
        "(no periodic checkpoint during backlog) or at least spark.backlog.checkpointing.interval "
        "(1min), because checkpoints during backlog may only be rarer"
    )


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("checkpointing.interval", "0", "must be at least 1ms"),
        ("checkpointing.interval", "30", "a unit is required"),
        ("checkpointing.interval", "soon", "expected a number with a unit"),
        ("checkpointing.interval-during-backlog", "1 fortnight", "unknown unit 'fortnight'"),
        ("checkpointing.min-pause", "-1s", "expected a number with a unit"),
        ("checkpointing.max-batch-rows", "0", "expected a whole number above 0"),
        ("checkpointing.max-batch-rows", "1e6", "expected a whole number above 0"),
        ("checkpointing.max-batch-rows", "lots", "expected a whole number above 0"),
        ("job-name", "two\nlines", "expected 1-200 characters, all printable"),
        ("job-name", "   ", "expected 1-200 characters, all printable"),
        ("run-id", "x" * 201, "expected 1-200 characters"),
        ("metrics.url", "mysql://db/metrics", "expected an SQLAlchemy URL"),
        ("metrics.url", "/tmp/metrics.db", "expected an SQLAlchemy URL"),
        ("file-source.pending-files-threshold", "-2", "expected a whole number above 0"),
        ("lag.offsets.enter-threshold", "0", "expected a whole number above 0"),
        ("lag.offsets.enter-threshold", "many", "expected a whole number above 0"),
        ("lag.watermark.enter-threshold", "0", "must be at least 1ms"),
        ("lag.watermark.enter-threshold", "300", "a unit is required"),
        ("lag.min-dwell", "a while", "expected a number with a unit"),
        ("lease.ttl", "1s", "must be at least 3s"),
        ("metrics.retention", "30min", "must be at least 1h"),
        ("metrics.retention", "forever", "expected a number with a unit"),
    ],
)
def test_each_invalid_value_is_named_with_what_is_allowed(key, value, expected):
    [problem] = problems({f"spark.backlog.{key}": value})
    assert problem.startswith(f"spark.backlog.{key} = {value!r} is invalid: ")
    assert expected in problem


@pytest.mark.parametrize(
    ("rule", "enter", "leave", "expected"),
    [
        (
            "offsets",
            "1000",
            "-1",
            "expected 0 or a whole number above 0, at most 1_000_000_000_000",
        ),
        (
            "offsets",
            "1000",
            "1.5",
            "expected 0 or a whole number above 0, at most 1_000_000_000_000",
        ),
        (
            "watermark",
            "1h",
            "1 week",
            "unknown unit 'week'; expected a number with a unit, such as 500ms, 30s, 30min, 1h "
            "or 1d (or 0)",
        ),
    ],
)
def test_an_invalid_leave_threshold_is_named_with_what_is_allowed(rule, enter, leave, expected):
    key = f"spark.backlog.lag.{rule}.leave-threshold"
    [problem] = problems({f"spark.backlog.lag.{rule}.enter-threshold": enter, key: leave})
    assert problem == f"{key} = {leave!r} is invalid: {expected}"


def test_unknown_key_is_refused_with_the_known_ones():
    [problem] = problems({"spark.backlog.checkpointing.intervall": "5s"})
    assert problem.startswith("spark.backlog.checkpointing.intervall = '5s' is not a known setting")
    assert "spark.backlog.checkpointing.interval," in problem


def test_all_problems_are_reported_together():
    found = problems(
        {
            "spark.backlog.checkpointing.interval": "fast",
            "spark.backlog.checkpointing.max-batch-rows": "none",
        }
    )
    assert [p.split(" = ")[0] for p in found] == [
        "spark.backlog.checkpointing.interval",
        "spark.backlog.checkpointing.max-batch-rows",
    ]


def test_job_name_is_required_when_spark_has_no_app_name():
    with pytest.raises(ConfigError, match=r"spark.backlog.job-name is not set and there is no"):
        BacklogConfig.from_spark_conf({})


def test_describe_is_one_readable_line():
    config = BacklogConfig.from_spark_conf(
        {**BASE, "spark.backlog.run-id": "r1", "spark.backlog.checkpointing.interval": "2s"}
    )
    assert config.describe() == (
        "job=orders run=r1 interval=2s interval-during-backlog=same as interval "
        "min-pause=0 max-batch-rows=1000000"
    )


LAG = "spark.backlog.lag."


def lag_rules(**conf: str) -> LagRules:
    return BacklogConfig.from_spark_conf({**BASE, **conf}).lag_rules


def test_lag_rules_with_both_thresholds():
    assert lag_rules(
        **{
            f"{LAG}offsets.enter-threshold": "100_000",
            f"{LAG}offsets.leave-threshold": "0",
            f"{LAG}watermark.enter-threshold": "10min",
            f"{LAG}watermark.leave-threshold": "90s",
            f"{LAG}min-dwell": "30s",
        }
    ) == LagRules(
        offsets=Thresholds(enter=100_000, leave=0),
        watermark_s=Thresholds(enter=600, leave=90),
        min_dwell_s=30,
    )


def test_an_unset_leave_threshold_is_half_the_enter_one():
    rules = lag_rules(
        **{f"{LAG}offsets.enter-threshold": "1001", f"{LAG}watermark.enter-threshold": "5min"}
    )
    assert rules == LagRules(
        offsets=Thresholds(enter=1001, leave=500), watermark_s=Thresholds(enter=300, leave=150)
    )


def test_a_leave_threshold_equal_to_the_enter_one_is_accepted():
    rules = lag_rules(
        **{f"{LAG}offsets.enter-threshold": "500", f"{LAG}offsets.leave-threshold": "500"}
    )
    assert rules.offsets == Thresholds(enter=500, leave=500)


def test_a_leave_threshold_above_the_enter_one_is_refused():
    found = problems(
        {
            f"{LAG}offsets.enter-threshold": "1000",
            f"{LAG}offsets.leave-threshold": "1001",
            f"{LAG}watermark.enter-threshold": "1min",
            f"{LAG}watermark.leave-threshold": "61s",
        }
    )
    assert found == [
        "spark.backlog.lag.offsets.leave-threshold = '1001' is invalid: it must be at most "
        "spark.backlog.lag.offsets.enter-threshold (1000), since lag leaves backlog at or "
        "below it",
        "spark.backlog.lag.watermark.leave-threshold = '61s' is invalid: it must be at most "
        "spark.backlog.lag.watermark.enter-threshold (1min), since lag leaves backlog at or "
        "below it",
    ]


def test_a_leave_threshold_without_its_enter_threshold_is_refused():
    found = problems(
        {f"{LAG}offsets.leave-threshold": "10", f"{LAG}watermark.leave-threshold": "1min"}
    )
    assert found == [
        "spark.backlog.lag.offsets.leave-threshold = '10' is invalid: it applies only with "
        "spark.backlog.lag.offsets.enter-threshold set, which turns the rule on",
        "spark.backlog.lag.watermark.leave-threshold = '1min' is invalid: it applies only with "
        "spark.backlog.lag.watermark.enter-threshold set, which turns the rule on",
    ]


def test_describe_names_the_lag_rules_that_are_on():
    config = BacklogConfig.from_spark_conf(
        {
            **BASE,
            "spark.backlog.run-id": "r1",
            f"{LAG}offsets.enter-threshold": "5000",
            f"{LAG}watermark.enter-threshold": "5min",
            f"{LAG}min-dwell": "1min",
        }
    )
    assert config.describe() == (
        "job=orders run=r1 interval=30s interval-during-backlog=same as interval "
        "min-pause=0 max-batch-rows=1000000 offset-lag=enter>5000,leave<=2500 "
        "watermark-lag=enter>5min,leave<=150s lag-min-dwell=1min"
    )


def test_a_running_job_takes_new_intervals_validated_as_at_startup():
    conf = {
        "spark.backlog.job-name": "events",
        "spark.backlog.run-id": "run-1",
        "spark.backlog.checkpointing.interval": "2s",
        "spark.backlog.checkpointing.interval-during-backlog": "1min",
        "spark.backlog.checkpointing.max-batch-rows": "5000",
        "spark.master": "local[2]",
    }
    config = BacklogConfig.from_spark_conf(conf)
    changed = reconfigured(config, conf, {"spark.backlog.checkpointing.interval": "5s"})
    assert (changed.interval_s, changed.interval_during_backlog_s) == (5.0, 60.0)
    assert (changed.job_name, changed.run_id, changed.max_batch_rows) == ("events", "run-1", 5000)

    with pytest.raises(ConfigError) as raised:
        reconfigured(config, conf, {"spark.backlog.checkpointing.interval": "2min"})
    assert raised.value.problems == [
        "spark.backlog.checkpointing.interval-during-backlog = '1min' is invalid: it must be 0 "
        "(no periodic checkpoint during backlog) or at least spark.backlog.checkpointing."
        "interval (2min), because checkpoints during backlog may only be rarer"
    ]
    with pytest.raises(ConfigError) as raised:
        reconfigured(config, conf, {"spark.backlog.checkpointing.max-batch-rows": "9"})
    assert raised.value.problems == [
        "spark.backlog.checkpointing.max-batch-rows = '9' cannot change while the job runs; "
        "only spark.backlog.checkpointing.interval, "
        "spark.backlog.checkpointing.interval-during-backlog, "
        "spark.backlog.checkpointing.freshness-target can"
    ]


@pytest.mark.parametrize(
    ("key", "highest", "too_high", "expected"),
    [
        ("checkpointing.interval", "1d", "25h", "must be at least 1ms and at most 1d"),
        ("checkpointing.interval", "1d", "9" * 400 + "s", "must be at least 1ms and at most 1d"),
        ("checkpointing.interval-during-backlog", "1d", "2d", "must be at most 1d"),
        ("checkpointing.min-pause", "24h", "1441min", "must be at most 1d"),
        ("lag.watermark.enter-threshold", "30d", "31d", "must be at least 1ms and at most 30d"),
        ("lag.min-dwell", "1d", "1.5d", "must be at most 1d"),
        ("lease.ttl", "1d", "7d", "must be at least 3s and at most 1d"),
        ("metrics.retention", "366d", "367d", "must be at least 1h and at most 366d"),
        (
            "checkpointing.max-batch-rows",
            "1_000_000_000_000",
            "1_000_000_000_001",
            "expected a whole number above 0, at most 1_000_000_000_000",
        ),
        (
            "file-source.pending-files-threshold",
            "1000000000000",
            "9" * 5000,
            "expected a whole number above 0, at most 1_000_000_000_000",
        ),
        (
            "lag.offsets.enter-threshold",
            "1_000_000_000_000",
            "10_000_000_000_000",
            "expected a whole number above 0, at most 1_000_000_000_000",
        ),
    ],
)
def test_every_duration_and_count_has_an_upper_bound(key, highest, too_high, expected):
    parse(**{key.replace("-", "_"): highest})  # the bound itself is allowed
    [problem] = problems({f"spark.backlog.{key}": too_high})
    assert problem.startswith(f"spark.backlog.{key} = {too_high!r} is invalid: {expected}")


def test_a_watermark_leave_threshold_has_the_enter_thresholds_bound():
    [problem] = problems(
        {f"{LAG}watermark.enter-threshold": "30d", f"{LAG}watermark.leave-threshold": "31d"}
    )
    assert problem == f"{LAG}watermark.leave-threshold = '31d' is invalid: must be at most 30d"


def test_a_running_job_cannot_be_stalled_by_an_endless_interval():
    conf = {**BASE, "spark.backlog.run-id": "r1"}
    endless = "9" * 400 + "s"
    with pytest.raises(ConfigError) as raised:
        reconfigured(
            parse(), conf, {"spark.backlog.checkpointing.interval-during-backlog": endless}
        )
    assert raised.value.problems == [
        f"spark.backlog.checkpointing.interval-during-backlog = {endless!r} is invalid: "
        "must be at most 1d"
    ]


def test_a_key_in_another_case_is_refused_naming_the_key_it_meant():
    [problem] = problems({"spark.Backlog.checkpointing.Interval": "5s"})
    assert problem.startswith(
        "spark.Backlog.checkpointing.Interval = '5s' is not a known setting; keys are "
        "case-sensitive: did you mean spark.backlog.checkpointing.interval? known: "
        "spark.backlog.checkpointing.interval, "
    )


def test_a_misspelled_key_is_refused_with_the_closest_known_key():
    [problem] = problems({"spark.backlog.lag.watermark.enter-treshold": "5min"})
    assert problem.startswith(
        "spark.backlog.lag.watermark.enter-treshold = '5min' is not a known setting; "
        "did you mean spark.backlog.lag.watermark.enter-threshold? known: "
    )
    [unlike_any] = problems({"SPARK.BACKLOG.nonsense": "1"})
    assert unlike_any.startswith("SPARK.BACKLOG.nonsense = '1' is not a known setting; known: ")


def test_a_running_job_refuses_an_unknown_key_as_unknown():
    conf = {**BASE, "spark.backlog.run-id": "r1"}
    with pytest.raises(ConfigError) as raised:
        reconfigured(parse(), conf, {"spark.backlog.checkpointing.Interval": "5s"})
    [problem] = raised.value.problems
    assert problem.startswith(
        "spark.backlog.checkpointing.Interval = '5s' is not a known setting; keys are "
        "case-sensitive: did you mean spark.backlog.checkpointing.interval? "
    )


@pytest.mark.parametrize(
    "name", ["My Streaming Job", " padded ", "-leading-dash", "Aufträge → täglich", "n" * 200]
)
def test_any_printable_name_is_kept_verbatim(name):
    assert BacklogConfig.from_spark_conf({}, app_name=name).job_name == name
    config = BacklogConfig.from_spark_conf({**BASE, "spark.backlog.run-id": name})
    assert config.run_id == name
    assert config.describe().startswith(f"job=orders run={name} ")


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("two\nlines", r"it contains '\n' (U+000A)"),
        ("tab\there", r"it contains '\t' (U+0009)"),
        ("bell\x07", r"it contains '\x07' (U+0007)"),
        ("", "it is blank"),
        ("n" * 201, "it has 201"),
    ],
)
def test_a_name_with_control_characters_or_none_at_all_is_refused(name, reason):
    [problem] = problems({"spark.backlog.run-id": name})
    assert problem == (
        f"spark.backlog.run-id = {name!r} is invalid: expected 1-200 characters, all printable "
        f"(no control characters such as newline or tab); {reason}"
    )


def test_an_app_name_used_as_the_job_name_is_named_as_such_when_refused():
    with pytest.raises(ConfigError) as raised:
        BacklogConfig.from_spark_conf({}, app_name="nightly\r\n")
    assert raised.value.problems == [
        "spark.backlog.job-name (unset, so spark.app.name) = 'nightly\\r\\n' is invalid: "
        "expected 1-200 characters, all printable (no control characters such as newline or "
        "tab); it contains '\\r' (U+000D)"
    ]


def test_a_bad_metrics_url_is_named_without_its_password():
    with pytest.raises(ConfigError) as raised:
        BacklogConfig.from_spark_conf(
            {**BASE, "spark.backlog.metrics.url": "mysql://metrics:s3cr3t-pw@db:3306/metrics"}
        )
    assert raised.value.problems == [
        "spark.backlog.metrics.url = 'mysql://metrics:*****@db:3306/metrics' is invalid: "
        "expected an SQLAlchemy URL: sqlite:///relative.db, sqlite:////absolute/path.db or "
        "postgresql://user@host:5432/database (a password goes after the user, user:password@)"
    ]
    assert "s3cr3t-pw" not in str(raised.value)


def test_an_unknown_secret_looking_key_is_named_without_its_value():
    [problem] = problems({"spark.backlog.metrics.password": "s3cr3t-pw"})
    assert problem.startswith("spark.backlog.metrics.password = ***** is not a known setting")
    assert "s3cr3t" not in problem


def test_a_restart_only_key_sent_to_a_running_job_is_named_without_its_password():
    conf = {**BASE, "spark.backlog.run-id": "r1"}
    with pytest.raises(ConfigError) as raised:
        reconfigured(parse(), conf, {"spark.backlog.metrics.url": "postgresql://u:s3cr3t@h/db"})
    assert raised.value.problems == [
        "spark.backlog.metrics.url = 'postgresql://u:*****@h/db' cannot change while the job "
        "runs; only spark.backlog.checkpointing.interval, "
        "spark.backlog.checkpointing.interval-during-backlog, "
        "spark.backlog.checkpointing.freshness-target can"
    ]


def test_a_config_error_hides_passwords_whoever_words_it():
    error = ConfigError(['the request is not JSON: \'{"url": "postgresql://u:s3cr3t@h/db"\''])
    assert "s3cr3t" not in str(error)
    assert error.problems == ['the request is not JSON: \'{"url": "postgresql://u:*****@h/db"\'']
