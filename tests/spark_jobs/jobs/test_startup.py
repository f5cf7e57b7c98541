import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs.jobs.startup import (
    JavaMissing,
    job_environment,
    require_java,
    spark_submit_command,
)

SCRIPTS = Path(__file__).parents[3] / "scripts"


def fake_java(directory: Path, version: str) -> Path:
    """A JAVA_HOME whose java prints the banner of the given version."""
    binary = directory / "bin" / "java"
    binary.parent.mkdir(parents=True)
    binary.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2024-01-16' >&2\n")
    binary.chmod(0o755)
    return directory


@pytest.fixture
def outside_spark_submit(monkeypatch):
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    return monkeypatch


def test_java_17_or_newer_is_accepted(tmp_path, outside_spark_submit):
    outside_spark_submit.setenv("JAVA_HOME", str(fake_java(tmp_path, "21.0.2")))
    require_java()


def test_an_old_java_is_named_with_what_to_install(tmp_path, outside_spark_submit):
    home = fake_java(tmp_path, "11.0.22")
    outside_spark_submit.setenv("JAVA_HOME", str(home))
    with pytest.raises(JavaMissing) as error:
        require_java()
    assert str(error.value) == (
        f"Spark 4 needs Java 17 or newer, but {home}/bin/java is 11; install one "
        "(Debian: apt-get install -y openjdk-17-jre-headless) and set JAVA_HOME"
    )


def test_no_java_at_all(tmp_path, outside_spark_submit):
    outside_spark_submit.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    with pytest.raises(JavaMissing, match="needs Java 17 or newer, but no java was found"):
        require_java()


def test_under_spark_submit_the_running_jvm_is_enough(monkeypatch, tmp_path):
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "12345")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    require_java()


@pytest.mark.parametrize(("version", "code"), [("17.0.15", 0), ("1.8.0_392", 1), ("11", 1)])
def test_the_setup_scripts_java_check(tmp_path, version, code):
    env = {"JAVA_HOME": str(fake_java(tmp_path, version)), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [SCRIPTS / "check-java"], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == code
    if code:
        assert "Java 17 or newer is required by Spark 4" in result.stderr


def test_jobs_run_spark_submit_and_workers_from_this_interpreter():
    command = spark_submit_command("job.py", {"spark.a": "1", "spark.b": "x y"}, "--flag")
    assert command == [
        str(Path(sys.executable).parent / "spark-submit"),
        "--conf",
        "spark.a=1",
        "--conf",
        "spark.b=x y",
        "job.py",
        "--flag",
    ]
    environment = job_environment()
    assert environment["PYSPARK_PYTHON"] == sys.executable
    assert environment["SPARK_LOCAL_IP"]
