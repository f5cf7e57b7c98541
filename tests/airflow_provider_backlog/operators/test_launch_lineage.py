"""The launch's part in OpenLineage: the lineage it reports, the ``spark.openlineage.*``
properties it passes spark-submit when asked, and that it works the same without the
OpenLineage provider."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from airflow.providers.common.compat.openlineage.facet import Dataset
from airflow.providers.common.compat.openlineage.utils import spark as compat_spark

from airflow_provider_backlog.hooks.submit import BacklogSubmitHook
from airflow_provider_backlog.lineage.facets import CHECKPOINT_FACET, BacklogCheckpointRunFacet
from airflow_provider_backlog.operators.launch import BacklogLaunchOperator
from airflow_provider_backlog.profiles import PhaseProfile
from spark_jobs.backlog.options import LEASE_WAIT_FOR_HANDOVER
from tests.airflow_provider_backlog.conftest import CONN_ID, use_connection

PARENT = {"spark.openlineage.parentJobName": "backlog_phased.launch_backlog_profile"}


def launch(**kwargs) -> BacklogLaunchOperator:
    return BacklogLaunchOperator(
        task_id="launch",
        job_name="events",
        application="/app/events_pipeline.py",
        profile=PhaseProfile("2s", conf={"spark.openlineage.namespace": "streaming"}),
        metrics_conn_id=CONN_ID,
        **kwargs,
    )


def test_the_launch_reports_the_datasets_its_arguments_name_at_start_and_completion():
    operator = launch(
        application_args=[
            "--history",
            Path("/data/history"),
            "--landing",
            "/data/landing",
            "--output",
            "/data/output",
            "--checkpoint",
            "/data/checkpoint",
        ]
    )
    for lineage in (
        operator.get_openlineage_facets_on_start(),
        operator.get_openlineage_facets_on_complete(task_instance=None),
    ):
        assert lineage.inputs == [
            Dataset(namespace="file", name="/data/history"),
            Dataset(namespace="file", name="/data/landing"),
        ]
        assert lineage.outputs == [Dataset(namespace="file", name="/data/output")]
        assert lineage.run_facets == {
            CHECKPOINT_FACET: BacklogCheckpointRunFacet(namespace="file", name="/data/checkpoint")
        }


@pytest.fixture
def submitted(monkeypatch, tmp_path) -> list[list[str]]:
    """The spark-submit commands launches build; none is run."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"})
    )
    use_connection(monkeypatch, host=str(tmp_path / "metrics.db"))
    commands: list[list[str]] = []

    def start(self: BacklogSubmitHook, application: str, *args: object, **kwargs: object):
        commands.append(self.submit_command(application))
        raise InterruptedError("not run")

    monkeypatch.setattr(BacklogSubmitHook, "start", start)
    monkeypatch.setattr(
        compat_spark,
        "inject_parent_job_information_into_spark_properties",
        lambda properties, context: {**properties, **PARENT},
    )
    return commands


def confs(command: list[str]) -> list[str]:
    return [command[i + 1] for i, word in enumerate(command) if word == "--conf"]


def test_when_asked_the_parent_job_reaches_spark_submit_beside_the_runs_own_conf(submitted):
    operator = launch(openlineage_inject_parent_job_info=True)
    with pytest.raises(InterruptedError):
        operator._start_driver({}, {LEASE_WAIT_FOR_HANDOVER.key: "5min"})
    (command,) = submitted
    assert {
        "spark.openlineage.parentJobName=backlog_phased.launch_backlog_profile",
        "spark.openlineage.namespace=streaming",
        f"{LEASE_WAIT_FOR_HANDOVER.key}=5min",
    } <= set(confs(command))


def test_unless_asked_no_openlineage_property_is_added(submitted):
    with pytest.raises(InterruptedError):
        launch()._start_driver({})
    (command,) = submitted
    assert [conf for conf in confs(command) if conf.startswith("spark.openlineage.")] == [
        "spark.openlineage.namespace=streaming"
    ]


def test_without_the_openlineage_provider_the_launch_works_as_before():
    """Neither importing the operator nor asking it to pass OpenLineage's properties needs
    the provider: the properties are then left out, with the compat layer's warning."""
    script = textwrap.dedent(
        """
        import importlib.metadata, json, sys
        import importlib_metadata

        OPENLINEAGE = ("openlineage", "airflow.providers.openlineage")

        class WithoutOpenLineage:
            def find_spec(self, name, path=None, target=None):
                if name.startswith(OPENLINEAGE):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        def installed(distributions):
            def without_openlineage(**kwargs):
                for dist in distributions(**kwargs):
                    name = (dist.metadata["Name"] or "").lower().replace("_", "-")
                    if not name.startswith(("openlineage", "apache-airflow-providers-openlineage")):
                        yield dist
            return without_openlineage

        sys.meta_path.insert(0, WithoutOpenLineage())
        for metadata in (importlib.metadata, importlib_metadata):
            metadata.distributions = installed(metadata.distributions)

        from airflow_provider_backlog.lineage.spark import openlineage_spark_conf
        from airflow_provider_backlog.operators.launch import BacklogLaunchOperator
        from airflow_provider_backlog.profiles import PhaseProfile

        BacklogLaunchOperator(
            task_id="launch",
            job_name="events",
            application="app.py",
            profile=PhaseProfile("2s"),
            openlineage_inject_parent_job_info=True,
            openlineage_inject_transport_info=True,
        )
        added = openlineage_spark_conf({}, {"spark.x": "1"}, parent_job=True, transport=True)
        loaded = sorted(name for name in sys.modules if name.startswith(OPENLINEAGE))
        print(json.dumps({"added": added, "loaded": loaded}))
        """
    )
    ran = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])},
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert result["added"] == {}
    assert result["loaded"] == []
    assert "Skipping the injection of OpenLineage parent job information" in ran.stdout + ran.stderr
    assert "Skipping the injection of OpenLineage transport information" in ran.stdout + ran.stderr
