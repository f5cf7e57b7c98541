"""The adapter reads private members of the Spark provider's hook: these tests fail when
upstream moves or renames them, instead of a launch failing in production."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_backlog.hooks import spark_submit_adapter as adapter
from airflow_provider_backlog.hooks.spark_submit_adapter import SparkSubmitAdapter

CLUSTER_K8S = {
    "conn_type": "spark",
    "host": "k8s://https://k8s.example.com:6443",
    "extra": {"deploy-mode": "cluster", "namespace": "streaming"},
}


@pytest.fixture
def kubernetes_connection(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_K8S", json.dumps(CLUSTER_K8S))


def test_what_the_hook_resolved_from_the_connection_is_read_publicly(kubernetes_connection):
    hook = SparkSubmitAdapter(
        conn_id="spark_k8s", conf={"spark.a": "1"}, env_vars={"TZ": "UTC"}, name="events"
    )
    assert hook.master == "k8s://https://k8s.example.com:6443"
    assert hook.deploy_mode == "cluster"
    assert hook.kubernetes_namespace == "streaming"
    assert (hook.is_kubernetes, hook.is_yarn) == (True, False)
    assert hook.spark_binary == "spark-submit"
    assert hook.extra_env == {"TZ": "UTC"}
    hook.spark_conf["spark.b"] = "2"
    command = hook.submit_command("app.py")
    assert {"spark.a=1", "spark.b=2"} <= set(command)
    assert command[-1] == "app.py"


def test_the_command_starts_with_what_spark_binary_path_finds(kubernetes_connection):
    class Pinned(SparkSubmitAdapter):
        def spark_binary_path(self) -> list[str]:
            return ["/opt/spark/bin/spark-submit"]

    assert Pinned(conn_id="spark_k8s").submit_command("app.py")[0] == "/opt/spark/bin/spark-submit"


def test_without_the_spark_provider_the_import_says_how_to_install_it():
    """The provider is installed apart from its dependencies, so it can be missing."""
    module = "airflow.providers.apache.spark.hooks.spark_submit"
    blocked = f"import sys; sys.modules[{module!r}] = None\n"
    result = subprocess.run(
        [sys.executable, "-c", blocked + f"import {adapter.__name__}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line == f"ModuleNotFoundError: {adapter.SPARK_PROVIDER_MISSING}"


def test_the_spark_provider_named_in_the_error_is_the_pinned_one():
    constraints = (Path(__file__).resolve().parents[3] / "constraints.txt").read_text()
    pinned = re.search(r"^apache-airflow-providers-apache-spark==\S+$", constraints, re.M)
    assert pinned is not None
    assert adapter.SPARK_PROVIDER_MISSING.endswith(pinned.group())
