"""The lineage a launch reports to Airflow's OpenLineage integration, with the job's
checkpoint in a facet of its own.

A streaming job's checkpoint holds its progress: what it has read of its inputs and what
it has committed to its outputs. It is neither an input nor an output, so it goes in a run
facet, ``backlogCheckpoint``, defined as providers define theirs: an attrs class with a
JSON schema shipped beside it (``BacklogCheckpointRunFacet.json``), which the facet's
``_schemaURL`` names.

Importing this module needs ``apache-airflow-providers-openlineage`` (the provider's
``openlineage`` extra); the operators import it only when that integration asks them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from airflow.providers.common.compat.openlineage.facet import Dataset, RunFacet
from airflow.providers.openlineage.extractors import OperatorLineage
from attrs import define

from airflow_provider_backlog.lineage.naming import DatasetName, job_datasets

#: The facet's key among a run's facets.
CHECKPOINT_FACET = "backlogCheckpoint"
#: The ``$id`` of ``BacklogCheckpointRunFacet.json``: the project publishes no schema host,
#: so the schema is named by a versioned URN and ships with the provider.
SCHEMA_ID = "urn:airflow-provider-backlog:lineage:BacklogCheckpointRunFacet:1-0-0"


@define
class BacklogCheckpointRunFacet(RunFacet):
    """Where a backlog-aware job keeps its checkpoint, named as OpenLineage names a dataset
    (``file`` and ``/data/checkpoint``, ``s3://bucket`` and ``jobs/events/checkpoint``).

    :param namespace: The checkpoint's file system, as a dataset's namespace.
    :param name: The checkpoint directory in it, as a dataset's name.
    :param producer: What produced the facet (OpenLineage's ``_producer``); by default the
        OpenLineage client.
    """

    namespace: str
    name: str

    @staticmethod
    def _get_schema() -> str:
        return f"{SCHEMA_ID}#/$defs/BacklogCheckpointRunFacet"


def operator_lineage(
    application_args: Sequence[str], working_dir: str | None = None
) -> OperatorLineage:
    """The inputs, outputs and checkpoint of a job launched with ``application_args``; its
    relative paths are taken against ``working_dir`` (by default this process's, which a
    driver in client mode starts in)."""
    datasets = job_datasets(application_args, working_dir or os.getcwd())
    run_facets = {}
    if datasets.checkpoint is not None:
        checkpoint = datasets.checkpoint
        run_facets[CHECKPOINT_FACET] = BacklogCheckpointRunFacet(
            namespace=checkpoint.namespace, name=checkpoint.name
        )
    return OperatorLineage(
        inputs=[_dataset(named) for named in datasets.inputs],
        outputs=[_dataset(named) for named in datasets.outputs],
        run_facets=run_facets,
    )


def _dataset(named: DatasetName) -> Dataset:
    return Dataset(namespace=named.namespace, name=named.name)
