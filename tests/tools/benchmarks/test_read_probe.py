import os
import subprocess
import sys

import pytest

from tools.benchmarks.read_probe import (
    Measurement,
    data_batch,
    format_run,
    probe,
    stat_cpu_ticks,
    summarize,
    tree_cpu_s,
)


def progress(batch_id, rows, trigger_ms=0, **parts):
    return {
        "batchId": batch_id,
        "numInputRows": rows,
        "durationMs": {"triggerExecution": trigger_ms, **parts},
    }


def test_the_data_batch_is_measured_with_the_parts_of_its_duration():
    found = data_batch(
        [progress(0, 1_000, 500, addBatch=400, latestOffset=50), progress(1, 0, 10)],
        "hybrid",
        "aggregate",
    )
    assert (found.rows, found.duration_ms, found.rows_per_s) == (1_000, 500, 2_000)
    assert found.phases_ms["addBatch"] == 400
    assert found.phases_ms["getBatch"] == 0  # a part the progress event does not have


@pytest.mark.parametrize("batches", [[], [progress(0, 10), progress(1, 10)]])
def test_history_read_in_other_than_one_batch_is_refused_by_its_batches(batches):
    with pytest.raises(RuntimeError, match="expected the history in one batch"):
        data_batch(batches, "builtin", "windowed")


def run(source, query, rows, ms, cpu_s):
    return Measurement(source, query, rows, ms, {}, cpu_s)


def test_the_summary_compares_the_medians_of_each_source_per_query():
    measured = [
        run("builtin", "aggregate", 1_000_000, 1_000, 2.0),
        run("builtin", "aggregate", 1_000_000, 2_000, 2.0),
        run("builtin", "aggregate", 1_000_000, 9_000, 2.0),  # a stall: the median ignores it
        run("hybrid", "aggregate", 1_000_000, 2_500, 4.0),
        run("hybrid", "aggregate", 1_000_000, 2_500, 4.0),
        run("hybrid", "aggregate", 1_000_000, 2_500, 4.0),
        run("builtin", "windowed", 1_000_000, 1_000, 1.0),
    ]
    assert summarize(measured) == {
        "aggregate_builtin_rows_per_s": 500_000,
        "aggregate_hybrid_rows_per_s": 400_000,
        "aggregate_ratio": 0.8,
        "aggregate_builtin_rows_per_cpu_s": 500_000,
        "aggregate_hybrid_rows_per_cpu_s": 250_000,
        "aggregate_cpu_ratio": 0.5,
        "windowed_builtin_rows_per_s": 1_000_000,
        "windowed_builtin_rows_per_cpu_s": 1_000_000,
    }


def test_runs_alternate_which_source_goes_first_after_a_warm_up_of_each(capsys):
    order = []

    def fake(source, query):
        order.append((source, query))
        return run(source, query, 10, 1_000, 1.0)

    measured = probe(fake, ["aggregate", "windowed"], 2)
    assert order == [
        ("builtin", "aggregate"),
        ("hybrid", "aggregate"),
        ("builtin", "aggregate"),
        ("hybrid", "aggregate"),
        ("hybrid", "windowed"),
        ("builtin", "windowed"),
        ("hybrid", "aggregate"),
        ("builtin", "aggregate"),
        ("builtin", "windowed"),
        ("hybrid", "windowed"),
    ]
    assert len(measured) == 8  # the warm-ups are not measured
    assert "10 rows in 1.00 s = 0.00M rows/s, 1.0 CPU s" in capsys.readouterr().out


def test_a_run_is_shown_with_where_its_time_went():
    shown = format_run(
        Measurement("hybrid", "windowed", 2_000_000, 4_000, {"addBatch": 3_500}, 6.5)
    )
    assert shown == (
        "  windowed  hybrid  2,000,000 rows in 4.00 s = 0.50M rows/s, 6.5 CPU s (addBatch 3.50 s)"
    )


def test_a_stat_line_gives_the_parent_and_the_cpu_ticks_even_with_odd_command_names():
    line = "42 (a (b) c) S 7 42 42 0 -1 4194304 100 0 0 0 11 22 33 44 20 0 1 0 5 6 7"
    assert stat_cpu_ticks(line) == (7, 11 + 22 + 33 + 44)


def test_the_cpu_of_a_process_tree_counts_its_children():
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\n"
            "end = time.process_time() + 0.5\n"
            "while time.process_time() < end: pass\n"
            "input()",
        ],
        stdin=subprocess.PIPE,
    )
    try:
        own = tree_cpu_s(child.pid)
        while own < 0.4:  # until the child has spun its half second
            own = tree_cpu_s(child.pid)
        assert tree_cpu_s(os.getpid()) >= own
    finally:
        child.communicate(b"\n")
