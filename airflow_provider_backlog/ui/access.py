"""Who may see which job in the Backlog view, as Airflow's auth manager answers.

A job's metrics tell what the DAGs that launch or watch it do, so a job is shown to the
users who may read one of the DAGs whose tasks name it (their ``job_name``, read from the
serialized DAGs as the DAG tab reads them). A job no DAG names belongs to no DAG: it is
shown to the users who may read the metrics connection. Reading any connection but the
default one needs read access to it, since a ``conn_id`` in the query could otherwise
point the view at any metrics database.

The rules are the auth manager's own questions (``get_authorized_dag_ids``,
``is_authorized_connection``), asked as Airflow's core routes ask them, so whichever auth
manager the deployment runs (SimpleAuthManager with its roles and teams, FAB with per-DAG
permissions) decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.auth.managers.models.resource_details import ConnectionDetails
from airflow.configuration import conf
from airflow.models import Connection

from airflow_provider_backlog.ui.dag_jobs import DagJobs, jobs_of_dags


@dataclass(frozen=True)
class JobAccess:
    """Which jobs of one metrics connection one user may see.

    :param conn_id: The connection.
    :param named_by_readable_dags: The jobs named by the DAGs the user may read.
    :param named_by_any_dag: The jobs named by any DAG; None when the user may not read the
        connection, and so sees no job that no DAG names.
    """

    conn_id: str
    named_by_readable_dags: frozenset[str]
    named_by_any_dag: frozenset[str] | None

    def may_see(self, job_name: str) -> bool:
        if job_name in self.named_by_readable_dags:
            return True
        return self.named_by_any_dag is not None and job_name not in self.named_by_any_dag

    def shown(self) -> str:
        """Which jobs the user sees, in words."""
        if self.named_by_any_dag is None:
            return (
                "The jobs named by the DAGs you may read. A job no DAG names is shown to "
                f"users who may read connection {self.conn_id!r}."
            )
        return "The jobs named by the DAGs you may read, and the jobs no DAG names."

    def refusal(self, job_name: str) -> str:
        """Why the user may not see ``job_name``. To a user who may not read the
        connection, the same words whether a DAG they may not read names it or no such job
        exists: the answer tells neither."""
        if self.named_by_any_dag is None:
            return (
                f"job {job_name!r} is named by no DAG you may read, and only users who may "
                f"read connection {self.conn_id!r} see the jobs no DAG names"
            )
        return f"job {job_name!r} is named by DAGs you may not read"


def job_access(user: BaseUser, conn_id: str) -> JobAccess:
    """What ``user`` may see of connection ``conn_id``'s jobs, by the auth manager."""
    readable = get_auth_manager().get_authorized_dag_ids(user=user, method="GET")
    if not may_read_connection(user, conn_id):
        return JobAccess(conn_id, _names(jobs_of_dags(readable)), None)
    every_dag = jobs_of_dags()
    of_readable = _names(dag for dag in every_dag if dag.dag_id in readable)
    return JobAccess(conn_id, of_readable, _names(every_dag))


def may_read_connection(user: BaseUser, conn_id: str) -> bool:
    """Whether ``user`` may read connection ``conn_id``, with its team in multi-team mode,
    as Airflow's connection routes ask."""
    team_name = Connection.get_team_name(conn_id) if conf.getboolean("core", "multi_team") else None
    return get_auth_manager().is_authorized_connection(
        method="GET", details=ConnectionDetails(conn_id=conn_id, team_name=team_name), user=user
    )


def _names(dags: Iterable[DagJobs]) -> frozenset[str]:
    return frozenset(name for dag in dags for name in dag.job_names)
