"""The ``spark.openlineage.*`` properties a launch may pass the job, as ``SparkSubmitOperator``
passes them: the task's OpenLineage run as the parent of the Spark application's, and the
transport Airflow's OpenLineage integration sends its events with. Spark's OpenLineage
listener, a JVM package users add (the provider ships none), then reports the application
as a child of the task, to the same place.

The properties come from the OpenLineage provider's own helpers, through
``apache-airflow-providers-common-compat``, which logs a warning and adds nothing when the
OpenLineage provider is not installed. The transport's credentials (an API key, header
values, a password in its URL) are handed to Airflow's secrets masker before they reach
the spark-submit command line, which the Spark provider's hook logs: the task's log shows
``***`` in their place.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk.log import mask_secret

_TRANSPORT = "spark.openlineage.transport."
#: A transport's settings that are credentials, in a single transport or a composite one's
#: named transports: its API key and its headers' values (``Authorization: Bearer ...``).
_CREDENTIAL = re.compile(r"(?:^|\.)(?:auth\.apiKey|headers\.[^.]+)$")


def openlineage_spark_conf(
    context: Any, conf: Mapping[str, str], *, parent_job: bool, transport: bool
) -> dict[str, str]:
    """The properties to add to a run's Spark ``conf``: the parent job's (``parent_job``)
    and the transport's (``transport``), from the task's ``context``. Those of a kind the
    ``conf`` already sets (the profile's own ``spark.openlineage.parent*`` or
    ``spark.openlineage.transport.*``) are not added."""
    if not (parent_job or transport):
        return {}
    # Imported when asked for: it loads the OpenLineage provider's listener, if installed.
    from airflow.providers.common.compat.openlineage.utils.spark import (
        inject_parent_job_information_into_spark_properties,
        inject_transport_information_into_spark_properties,
    )

    properties: dict[str, Any] = dict(conf)
    if parent_job:
        properties = inject_parent_job_information_into_spark_properties(properties, context)
    if transport:
        properties = inject_transport_information_into_spark_properties(properties, context)
    added = {key: str(value) for key, value in properties.items() if key not in conf}
    for secret in transport_credentials(added):
        mask_secret(secret)
    return added


def transport_credentials(properties: Mapping[str, str]) -> list[str]:
    """The credentials among ``spark.openlineage.transport.*`` ``properties``: API keys and
    header values (``Bearer <key>`` as the helpers write them, and the key alone), and the
    passwords of URLs."""
    found = []
    for key, value in properties.items():
        if not key.startswith(_TRANSPORT):
            continue
        setting = key.removeprefix(_TRANSPORT)
        if _CREDENTIAL.search(setting):
            token = value.partition(" ")[2]
            found += [value, token] if token else [value]
        elif setting == "url" or setting.endswith(".url"):
            password = urlsplit(value).password
            found += [password] if password else []
    return found
