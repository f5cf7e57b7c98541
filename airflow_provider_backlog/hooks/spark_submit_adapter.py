"""The Spark provider's ``SparkSubmitHook``, with the parts it keeps private named publicly.

The launch needs what the hook resolved from the Spark connection (master, deploy mode,
spark-submit binary, namespace), the Spark conf and environment it will submit with, and the
command it would run; the hook offers none of them publicly. Reaching into its private
members from one place keeps the rest of the provider on public names, and
``test_spark_submit_adapter`` fails when the upstream hook changes the shape relied on here.
"""

from __future__ import annotations

from typing import Any

# The Spark provider is installed apart, without its dependencies: docs/airflow.md says why.
SPARK_PROVIDER_MISSING = (
    "airflow-provider-backlog launches jobs through apache-airflow-providers-apache-spark, "
    "which is not installed. Install it without its dependencies, since it requires "
    "pyspark-client, which would overwrite the full pyspark the job needs: pip install "
    "--no-deps apache-airflow-providers-apache-spark==6.3.4"
)
try:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
except ModuleNotFoundError as missing:
    raise ModuleNotFoundError(SPARK_PROVIDER_MISSING) from missing


class SparkSubmitAdapter(SparkSubmitHook):
    """``SparkSubmitHook`` with public names for what a launch reads from it.

    Takes ``SparkSubmitHook``'s arguments. ``spark_binary_path`` replaces how the command's
    spark-submit is found: override it, not the hook's private method.
    """

    @property
    def spark_conf(self) -> dict[str, Any]:
        """The Spark conf the command will carry; changes here reach the command."""
        return self._conf

    @property
    def extra_env(self) -> dict[str, str]:
        """The ``env_vars`` spark-submit (or, in cluster mode, the driver) gets."""
        return self._env_vars or {}

    @property
    def master(self) -> str:
        return self._connection["master"]

    @property
    def deploy_mode(self) -> str | None:
        return self._connection["deploy_mode"]

    @property
    def kubernetes_namespace(self) -> str | None:
        return self._connection["namespace"]

    @property
    def is_yarn(self) -> bool:
        return self._is_yarn

    @property
    def is_kubernetes(self) -> bool:
        return self._is_kubernetes

    def submit_command(self, application: str) -> list[str]:
        """The spark-submit command line for ``application``."""
        return self._build_spark_submit_command(application)

    def spark_binary_path(self) -> list[str]:
        """The spark-submit command's first words; the hook's own lookup by default."""
        return super()._get_spark_binary_path()

    def _get_spark_binary_path(self) -> list[str]:
        return self.spark_binary_path()
