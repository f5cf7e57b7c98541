"""Airflow provider for phased streaming jobs: launch a Spark job with backlog-aware
checkpointing, watch its phase in the metrics tables, and act at its transitions.

Registered through the ``apache_airflow_provider`` entry point; importing this package
imports neither Airflow nor pyspark.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

METRICS_CONN_TYPE = "backlog_metrics"


def get_provider_info() -> dict[str, Any]:
    """What ``airflow providers list`` and the connection form learn about this provider."""
    return {
        "package-name": "airflow-provider-backlog",
        "name": "Backlog-aware streaming",
        "description": (
            "Launch and watch Spark Structured Streaming jobs that checkpoint rarely while "
            "their sources process a backlog (Flink FLIP-309) and often once live."
        ),
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Backlog-aware streaming",
                "external-doc-url": (
                    "https://cwiki.apache.org/confluence/display/FLINK/FLIP-309%3A+Support+"
                    "using+larger+checkpointing+interval+when+source+is+processing+backlog"
                ),
                "tags": ["apache"],
            }
        ],
        "hooks": [
            {
                "integration-name": "Backlog-aware streaming",
                "python-modules": [
                    "airflow_provider_backlog.hooks.metrics",
                    "airflow_provider_backlog.hooks.submit",
                ],
            }
        ],
        "operators": [
            {
                "integration-name": "Backlog-aware streaming",
                "python-modules": [
                    "airflow_provider_backlog.operators.control",
                    "airflow_provider_backlog.operators.launch",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "Backlog-aware streaming",
                "python-modules": ["airflow_provider_backlog.sensors.metrics"],
            }
        ],
        "triggers": [
            {
                "integration-name": "Backlog-aware streaming",
                "python-modules": ["airflow_provider_backlog.triggers.metrics"],
            }
        ],
        "extra-links": ["airflow_provider_backlog.links.spark_ui.SparkUILink"],
        "connection-types": [
            {
                "hook-class-name": "airflow_provider_backlog.hooks.metrics.BacklogMetricsHook",
                "hook-name": "Backlog metrics database",
                "connection-type": METRICS_CONN_TYPE,
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "login", "port", "extra"],
                    "relabeling": {
                        "host": "SQLite file (when no URL is given)",
                        "password": "Password (for the URL's user)",
                    },
                    "placeholders": {
                        "host": "/var/lib/backlog/metrics.db",
                        "url": "postgresql://metrics@db.example.com:5432/metrics",
                    },
                },
                "conn-fields": {
                    "url": {
                        "label": "SQLAlchemy URL",
                        "description": (
                            "The database the jobs write their metrics to, as they are given it "
                            "in spark.backlog.metrics.url; its password may be left out and set "
                            "in the Password field"
                        ),
                        "schema": {"type": ["string", "null"]},
                    }
                },
            }
        ],
    }
