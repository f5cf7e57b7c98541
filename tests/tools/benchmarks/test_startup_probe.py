from spark_jobs.jobs.spark_home import installed_home
from tools.benchmarks.startup_probe import Run, environment, medians


def test_each_home_runs_as_a_user_has_it(monkeypatch):
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-XX:SharedArchiveFile=/tmp/a.jsa")
    monkeypatch.setenv("SPARK_HOME", "/opt/elsewhere")
    installed, compiled = environment("installed"), environment("compiled")
    assert installed["SPARK_HOME"] == str(installed_home())
    assert "SPARK_HOME" not in compiled  # the command makes the compiled home itself
    assert "JAVA_TOOL_OPTIONS" not in installed and "JAVA_TOOL_OPTIONS" not in compiled


def test_the_medians_are_per_home():
    runs = [
        Run("installed", 9.0, 12.0, 20.0),
        Run("compiled", 6.0, 9.0, 17.0),
        Run("installed", 7.0, 10.0, 22.0),
        Run("compiled", 5.0, 8.0, 18.0),
        Run("installed", 8.0, 11.0, 21.0),
    ]
    assert medians(runs, "installed") == {
        "to_first_batch_s": 8.0,
        "to_first_commit_s": 11.0,
        "cpu_s": 21.0,
    }
    assert medians(runs, "compiled")["to_first_batch_s"] == 5.5
