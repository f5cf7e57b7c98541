"""The ``spark.openlineage.*`` properties a launch adds to a run's Spark conf, and the
transport's credentials handed to Airflow's secrets masker."""

from __future__ import annotations

from airflow.providers.common.compat.openlineage.utils import spark as compat_spark
from airflow.sdk.log import redact

from airflow_provider_backlog.lineage.spark import openlineage_spark_conf, transport_credentials

COMPOSITE = {
    "spark.openlineage.parentJobName": "backlog_phased.launch_backlog_profile",
    "spark.openlineage.transport.type": "composite",
    "spark.openlineage.transport.continueOnFailure": "True",
    "spark.openlineage.transport.transports.marquez.type": "http",
    "spark.openlineage.transport.transports.marquez.url": "https://ol:url-pass-1@lineage.example",
    "spark.openlineage.transport.transports.marquez.endpoint": "api/v1/lineage",
    "spark.openlineage.transport.transports.marquez.auth.type": "api_key",
    "spark.openlineage.transport.transports.marquez.auth.apiKey": "Bearer key-2",
    "spark.openlineage.transport.transports.marquez.headers.X-Tenant-Token": "tenant-3",
    "spark.openlineage.transport.transports.backup.url": "http://backup.example:5000",
}


def test_nothing_is_added_unless_asked():
    assert openlineage_spark_conf({}, {"spark.x": "1"}, parent_job=False, transport=False) == {}


def test_the_profiles_own_openlineage_properties_stand():
    """The OpenLineage provider's helpers add nothing of a kind the conf sets already."""
    own = {
        "spark.openlineage.parentJobName": "mine",
        "spark.openlineage.transport.type": "console",
    }
    assert openlineage_spark_conf({}, own, parent_job=True, transport=True) == {}


def test_the_credentials_are_api_keys_header_values_and_url_passwords():
    assert transport_credentials(COMPOSITE) == ["url-pass-1", "Bearer key-2", "key-2", "tenant-3"]
    single = {
        "spark.openlineage.transport.url": "http://lineage.example",
        "spark.openlineage.transport.auth.apiKey": "key-4",
        "spark.openlineage.transport.headers.Authorization": "Bearer key-5",
    }
    assert transport_credentials(single) == ["key-4", "Bearer key-5", "key-5"]


def test_added_transport_credentials_are_masked_in_airflows_logs(monkeypatch):
    def from_airflow(properties: dict, context: object) -> dict:
        return {**properties, **COMPOSITE}

    monkeypatch.setattr(
        compat_spark, "inject_transport_information_into_spark_properties", from_airflow
    )
    added = openlineage_spark_conf({}, {"spark.x": "1"}, parent_job=False, transport=True)
    assert added == COMPOSITE
    command = " ".join(f"--conf {key}={value}" for key, value in added.items())
    logged = redact(f"Spark-Submit cmd: spark-submit {command} app.py")
    for secret in ("url-pass-1", "key-2", "tenant-3"):
        assert secret not in logged
    assert "transports.marquez.auth.apiKey=***" in logged
    assert "transports.backup.url=http://backup.example:5000" in logged
