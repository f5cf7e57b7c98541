"""The "Spark UI" button of a launch task: the UI of the run it launched."""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.sdk import BaseOperatorLink, XCom

#: The XCom key under which a launch task keeps its run's Spark UI address.
SPARK_UI_XCOM_KEY = "spark_ui_url"


class SparkUILink(BaseOperatorLink):
    """Links a launch task to the Spark UI its driver reported when it took its lease."""

    name = "Spark UI"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return XCom.get_value(ti_key=ti_key, key=SPARK_UI_XCOM_KEY) or ""
