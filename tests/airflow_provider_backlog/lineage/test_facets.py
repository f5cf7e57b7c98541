"""The lineage a launch hands Airflow's OpenLineage integration, and its checkpoint facet
against the JSON schema shipped beside it."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from airflow.providers.common.compat.openlineage.facet import Dataset
from openlineage.client.serde import Serde
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from airflow_provider_backlog.lineage import facets
from airflow_provider_backlog.lineage.facets import (
    CHECKPOINT_FACET,
    BacklogCheckpointRunFacet,
    operator_lineage,
)

SCHEMA = json.loads((Path(facets.__file__).parent / "BacklogCheckpointRunFacet.json").read_text())
#: What the facet's schema refers to: OpenLineage's RunFacet, a BaseFacet, which requires
#: ``_producer`` and ``_schemaURL`` (spec 2-0-2), here without fetching the spec.
OPENLINEAGE_SPEC = {
    "$defs": {
        "BaseFacet": {
            "type": "object",
            "properties": {
                "_producer": {"type": "string", "format": "uri"},
                "_schemaURL": {"type": "string", "format": "uri"},
            },
            "required": ["_producer", "_schemaURL"],
        },
        "RunFacet": {"allOf": [{"$ref": "#/$defs/BaseFacet"}]},
    }
}


def validator() -> jsonschema.Draft202012Validator:
    registry = Registry().with_resource(
        "https://openlineage.io/spec/2-0-2/OpenLineage.json",
        DRAFT202012.create_resource(OPENLINEAGE_SPEC),
    )
    return jsonschema.Draft202012Validator(SCHEMA, registry=registry)


def test_a_launch_reports_its_datasets_and_its_checkpoint_as_a_run_facet():
    lineage = operator_lineage(
        [
            "--history",
            "history",
            "--kafka-bootstrap-servers",
            "broker-1:9092,broker-2:9092",
            "--output",
            "s3a://bucket/events/out",
            "--checkpoint",
            "s3a://bucket/events/checkpoint",
        ],
        working_dir="/data",
    )
    assert lineage.inputs == [
        Dataset(namespace="file", name="/data/history"),
        Dataset(namespace="kafka://broker-1:9092", name="events"),
    ]
    assert lineage.outputs == [Dataset(namespace="s3://bucket", name="events/out")]
    assert lineage.run_facets == {
        CHECKPOINT_FACET: BacklogCheckpointRunFacet(
            namespace="s3://bucket", name="events/checkpoint"
        )
    }
    assert lineage.job_facets == {}


def test_a_job_without_a_checkpoint_argument_gets_no_checkpoint_facet():
    lineage = operator_lineage(["--output", "/data/out"], working_dir="/data")
    assert lineage.outputs == [Dataset(namespace="file", name="/data/out")]
    assert lineage.run_facets == {}


def test_relative_paths_are_taken_against_this_process_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert operator_lineage(["--output", "out"]).outputs == [
        Dataset(namespace="file", name=f"{tmp_path}/out")
    ]


def test_the_facet_is_what_its_shipped_schema_describes():
    facet = BacklogCheckpointRunFacet(namespace="file", name="/data/checkpoint")
    emitted = json.loads(Serde.to_json(facet))
    assert emitted == {
        "_producer": facet._producer,
        "_schemaURL": f"{SCHEMA['$id']}#/$defs/BacklogCheckpointRunFacet",
        "namespace": "file",
        "name": "/data/checkpoint",
    }
    validator().validate({CHECKPOINT_FACET: emitted})
    for field in ("name", "_schemaURL"):
        incomplete = {key: value for key, value in emitted.items() if key != field}
        with pytest.raises(jsonschema.ValidationError, match=f"'{field}' is a required property"):
            validator().validate({CHECKPOINT_FACET: incomplete})
