import pytest

from tools.benchmarks.benchmark import Result, ratios, verdict
from tools.pipelines.report import Reentry


def result(name, drain_s, p50_s):
    return Result(name, drain_s, 3, p50_s, 2 * p50_s, 10, Reentry(None, None))


SHORT = result("static-short", 120.0, 1.2)
LONG = result("static-long", 15.0, 16.0)
AWARE = result("backlog-aware", 16.5, 1.5)


def test_all_three_give_every_ratio():
    found = ratios([SHORT, LONG, AWARE])
    assert found["drain_speedup_vs_static_short"] == pytest.approx(120 / 16.5)
    assert found["drain_ratio_vs_static_long"] == pytest.approx(1.1)
    assert found["freshness_p50_ratio_vs_static_short"] == pytest.approx(1.25)
    assert found["freshness_p50_gain_vs_static_long"] == pytest.approx(16 / 1.5)
    assert found["drain_s"] == {"static-short": 120.0, "static-long": 15.0, "backlog-aware": 16.5}
    assert verdict("landing", found) == (
        "landing: backlog-aware drains 7.3x faster than static short; takes 1.10x the time of "
        "static long; its live freshness p50 is 1.25x static short's; 10.7x better than "
        "static long's."
    )


def test_a_subset_gives_the_ratios_of_the_pairs_that_ran():
    found = ratios([LONG, AWARE])
    assert set(found) == {
        "drain_ratio_vs_static_long",
        "freshness_p50_gain_vs_static_long",
        "backlog_checkpoints",
        "drain_s",
    }
    assert verdict("kafka", found) == (
        "kafka: backlog-aware takes 1.10x the time of static long; 10.7x better than static long's."
    )


def test_a_run_of_one_configuration_has_no_ratios_to_tell():
    found = ratios([result("backlog-aware", 7.5, 0.9)])
    assert verdict("postgres-cdc", found) is None


def test_a_slower_drain_is_not_called_faster():
    found = ratios([result("static-short", 200.0, 1.0), result("backlog-aware", 250.0, 1.0)])
    assert verdict("postgres-cdc", found) == (
        "postgres-cdc: backlog-aware drains slower than static short, at 0.80x its speed; "
        "its live freshness p50 is 1.00x static short's."
    )
