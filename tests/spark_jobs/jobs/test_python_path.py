import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pyspark

from spark_jobs.jobs import python_path, worker_daemon
from spark_jobs.jobs.python_path import installed_copies
from spark_jobs.jobs.worker_daemon import DAEMON_CONF

SITE = "/venv/lib/python3.11/site-packages"
ZIP = f"{SITE}/pyspark/python/lib/pyspark.zip"
PY4J = f"{SITE}/pyspark/python/lib/py4j-0.10.9.9-src.zip"


def installed(path: Path) -> bool:
    return str(path) == f"{SITE}/pyspark/__init__.py"


def test_the_zips_inside_an_installed_pyspark_on_the_path_are_its_copies():
    path = [ZIP, PY4J, "/app", SITE]
    assert installed_copies(path, installed) == [ZIP, PY4J]


def test_a_spark_distributions_zips_stay_when_no_installed_pyspark_is_on_the_path():
    distribution = ["/opt/spark/python/lib/pyspark.zip", "/opt/spark/python/lib/py4j.zip"]
    assert installed_copies([*distribution, SITE], installed) == []
    # The package is there, but not importable from this path: its zip is what serves.
    assert installed_copies([ZIP, PY4J, "/app"], installed) == []
    # A directory named like the package that holds none.
    assert installed_copies([ZIP, SITE], lambda _: False) == []


def test_nothing_moves_once_pyspark_is_imported(monkeypatch):
    real = Path(pyspark.__file__).parent
    copy = str(real / "python" / "lib" / "pyspark.zip")
    monkeypatch.setattr(sys, "path", [copy, str(real.parent)])
    python_path.prefer_installed_pyspark()
    assert sys.path == [copy, str(real.parent)]


def imported_from(*code: str) -> str:
    """Where a fresh interpreter, with the zips first as Spark starts its workers, imports
    PySpark from."""
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    zips = [str(lib / "pyspark.zip"), *map(str, lib.glob("py4j-*.zip"))]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(zips)}
    program = "\n".join([*code, "import pyspark, py4j", "print(pyspark.__file__, py4j.__file__)"])
    run = subprocess.run(
        [sys.executable, "-c", program], env=environment, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_a_process_started_like_a_worker_imports_the_installed_package_after_the_fix():
    assert ".zip" in imported_from()
    fixed = imported_from(
        "from spark_jobs.jobs.python_path import prefer_installed_pyspark",
        "prefer_installed_pyspark()",
    )
    assert ".zip" not in fixed
    assert fixed.split()[0] == pyspark.__file__


def test_the_daemon_conf_names_its_own_importable_module():
    assert importlib.util.find_spec(DAEMON_CONF[1]).origin == worker_daemon.__file__


def test_site_directories_with_spaces_and_quotes_are_matched_by_their_parts():
    site = '/opt/my env\'s "venv"/lib/site packages'
    copy = f"{site}/pyspark/python/lib/pyspark.zip"
    assert installed_copies([copy, site], lambda p: str(p) == f"{site}/pyspark/__init__.py") == [
        copy
    ]
    # A name that only ends like the package's does not count.
    other = "/opt/notpyspark/python/lib/pyspark.zip"
    assert installed_copies([other, "/opt"], lambda _: True) == []
