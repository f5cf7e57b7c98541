"""``scripts/test`` runs the suite side by side with ``--dist loadgroup``, and relies on the
tests of one ``xdist_group`` running on one worker: one Airflow deployment then serves a
whole module. pytest-xdist stops grouping without a word under some pytest releases
(pytest-xdist#1386, pytest 9.2); this runs a small grouped module the same way."""

import subprocess
import sys

GROUPED = """
import os
import pytest

pytestmark = pytest.mark.xdist_group("one")


@pytest.mark.parametrize("n", range(6))
def test_grouped(n):
    print("WORKER", os.environ["PYTEST_XDIST_WORKER"])
"""


def test_the_tests_of_one_group_run_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    command = [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-rA"]
    command += ["-p", "no:cacheprovider", "-c", str(tmp_path / "none.ini"), str(tmp_path)]
    (tmp_path / "none.ini").write_text("[pytest]\n")
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    workers = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("WORKER")]
    assert len(workers) == 6 and len(set(workers)) == 1, workers
