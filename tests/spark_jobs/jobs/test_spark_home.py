import logging
import os
import threading
from pathlib import Path

import pytest

from spark_jobs.jobs import spark_home
from spark_jobs.jobs.spark_home import compiled_home, serves, with_compiled_home


@pytest.fixture
def installed(tmp_path) -> Path:
    """An installed PySpark's layout: its launch scripts, jars, and the zips Spark puts on
    its Python processes' path."""
    package = tmp_path / "site-packages" / "pyspark"
    for directory in ("bin", "jars", "sbin", "python/lib", "python/pyspark"):
        (package / directory).mkdir(parents=True)
    (package / "bin" / "spark-class").write_text("#!/bin/sh\n")
    (package / "jars" / "spark-core.jar").write_bytes(b"PK")
    (package / "python" / "lib" / "pyspark.zip").write_bytes(b"PK")
    (package / "__init__.py").write_text("")
    return package


def test_the_home_is_the_installed_package_but_for_the_zip_copies(installed, tmp_path):
    home = compiled_home(installed, tmp_path)
    assert (home / "bin" / "spark-class").read_text() == "#!/bin/sh\n"
    assert (home / "jars").resolve() == installed / "jars"
    assert (home / "sbin").resolve() == installed / "sbin"
    assert (home / "python" / "pyspark").resolve() == installed / "python" / "pyspark"
    assert not (home / "python" / "lib").exists()
    # The package's files are linked, not copied: nothing of it goes stale.
    assert all(entry.is_symlink() for entry in home.iterdir() if entry.name != "python")


def test_one_home_per_installation_made_once_by_drivers_starting_together(installed, tmp_path):
    homes: list[Path] = []
    threads = [
        threading.Thread(target=lambda: homes.append(compiled_home(installed, tmp_path)))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(homes)) == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".spark-home")] == []
    other = installed.parent.parent / "other" / "pyspark"
    other.parent.mkdir()
    installed.rename(other)
    assert compiled_home(other, tmp_path) != homes[0]


@pytest.mark.parametrize(
    "master, served",
    [
        (None, True),
        ("local[2]", True),
        ("local-cluster[2,1,1024]", True),
        ("spark://master:7077", True),
        ("yarn", False),  # ships pyspark.zip to its containers
        ("k8s://https://api:6443", False),
    ],
)
def test_the_home_serves_local_and_standalone_masters(master, served):
    assert serves(master) is served


def test_a_spark_home_set_is_kept_a_distribution_or_the_installed_package(tmp_path):
    installed = spark_home.installed_home()
    for home in (tmp_path / "spark-4.3.0-bin-hadoop3", installed):
        environment = {"SPARK_HOME": str(home), "PATH": "/bin"}
        assert with_compiled_home(environment, "local[2]", tmp_path) == environment


def test_where_none_is_set_the_compiled_home_is(tmp_path):
    installed = spark_home.installed_home()
    assert installed is not None
    found = with_compiled_home({}, "local[2]", tmp_path)
    assert Path(found["SPARK_HOME"]).parent == tmp_path
    assert (Path(found["SPARK_HOME"]) / "jars").resolve() == installed / "jars"
    assert with_compiled_home({}, "yarn", tmp_path) == {}


def test_a_home_that_cannot_be_made_leaves_the_environment_as_it_was(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=spark_home.__name__)
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    if os.access(read_only, os.W_OK):  # root writes anywhere
        read_only.chmod(0o755)
        read_only.rmdir()
        read_only.write_text("a file where the directory would be")
    assert with_compiled_home({"PATH": "/bin"}, None, read_only) == {"PATH": "/bin"}
    assert "compile PySpark at start" in caplog.text
