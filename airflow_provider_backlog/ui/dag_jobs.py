"""Which streaming jobs a DAG runs, for the Backlog tab of its page and for who may see a
job (ui/access.py: the readers of the DAGs that name it).

The api-server never imports DAG files: it knows a DAG by the serialized form the DAG
processor stored in Airflow's database. There, this provider's operators and sensors keep
``job_name`` as written, since it is a template field (``"{{ params.job_name }}"`` stays a
template), while ``metrics_conn_id`` is not stored at all: the tab reads the connection
the request names. A template that needs only the DAG's params is rendered with their
defaults, which is the job a run started without a conf uses; any other template is only
known to a run, and is reported as such.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from airflow.models.serialized_dag import SerializedDagModel
from airflow.utils.session import NEW_SESSION, provide_session
from jinja2 import StrictUndefined, TemplateError
from jinja2.sandbox import SandboxedEnvironment
from sqlalchemy.orm import Session

#: The modules whose operators and sensors take ``job_name``.
JOB_MODULES = ("airflow_provider_backlog.operators.", "airflow_provider_backlog.sensors.")

_TEMPLATES = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)


class UnknownDag(LookupError):
    """No DAG of that id has been serialized: the DAG processor has not stored it (yet)."""


@dataclass(frozen=True)
class TaskJob:
    """The job one task of the DAG acts on.

    :param task_id: The task's id.
    :param written: Its ``job_name`` as the DAG file gives it, maybe a template (for a task
        mapped over an upstream task's output, that it is).
    :param job_name: The job's name: ``written`` itself, or its template rendered with the
        DAG's default params; None when only a run can render it.
    """

    task_id: str
    written: str
    job_name: str | None


@dataclass(frozen=True)
class DagJobs:
    """The tasks of a DAG that act on a streaming job, in the DAG's task order.

    :param dag_id: The DAG's id.
    :param tasks: Its tasks that take a ``job_name``; empty for a DAG without any.
    """

    dag_id: str
    tasks: tuple[TaskJob, ...]

    @property
    def job_names(self) -> tuple[str, ...]:
        """The names known without a run, each once, in order of first use."""
        return tuple(dict.fromkeys(t.job_name for t in self.tasks if t.job_name is not None))

    @property
    def unresolved(self) -> tuple[TaskJob, ...]:
        """The tasks whose job only a run knows."""
        return tuple(t for t in self.tasks if t.job_name is None)


@provide_session
def dag_jobs(dag_id: str, *, session: Session = NEW_SESSION) -> DagJobs:
    """The jobs of the DAG's latest serialized version; UnknownDag when it has none."""
    dag = SerializedDagModel.get_dag(dag_id, session=session)
    if dag is None:
        raise UnknownDag(f"no DAG {dag_id!r}: the DAG processor has not stored one of that id")
    return jobs_of(dag)


@provide_session
def jobs_of_dags(
    dag_ids: Collection[str] | None = None, *, session: Session = NEW_SESSION
) -> list[DagJobs]:
    """The jobs of each stored DAG's latest serialized version: of every DAG, or of those of
    ``dag_ids`` that are stored."""
    if dag_ids is None:
        dags = list(SerializedDagModel.read_all_dags(session=session).values())
    else:
        rows = SerializedDagModel.get_latest_serialized_dags(dag_ids=list(dag_ids), session=session)
        dags = [row.dag for row in rows]
    return [jobs_of(dag) for dag in dags]


def jobs_of(dag: Any) -> DagJobs:
    """The jobs of a serialized DAG's tasks."""
    defaults = {name: value for name, value in dag.params.dump().items() if value is not None}
    tasks = [
        job
        for task in dag.tasks
        if task._task_module.startswith(JOB_MODULES)
        for job in task_jobs(task, defaults)
    ]
    return DagJobs(dag.dag_id, tuple(tasks))


def task_jobs(task: Any, params: dict[str, Any]) -> list[TaskJob]:
    """The jobs of one task: one, or one per item of the literal list a mapped task is
    expanded over; a task mapped over an upstream task's output has a job only runs know."""
    if not task.is_mapped:
        written = [task.job_name]
    elif "job_name" in task.partial_kwargs:
        written = [task.partial_kwargs["job_name"]]
    else:
        expanded = getattr(task.expand_input, "value", None)
        names = expanded.get("job_name") if isinstance(expanded, dict) else None
        if not (isinstance(names, list | tuple) and all(isinstance(n, str) for n in names)):
            return [TaskJob(task.task_id, "mapped over values only a run knows", None)]
        written = list(names)
    return [TaskJob(task.task_id, str(text), render(str(text), params)) for text in written]


def render(written: str, params: dict[str, Any]) -> str | None:
    """``written`` with its template rendered from ``params`` alone; None if it needs more
    (``ds``, ``dag_run.conf``, a param without a default) or does not render."""
    if "{{" not in written and "{%" not in written:
        return written
    try:
        rendered = _TEMPLATES.from_string(written).render(params=params)
    except TemplateError:
        return None
    return rendered or None
