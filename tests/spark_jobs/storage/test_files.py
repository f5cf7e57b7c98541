import os

import pytest

from spark_jobs.storage.files import (
    StateDirectory,
    StateFileExists,
    normalize_location,
    resolve_uri,
)


def test_one_place_has_one_spelling(tmp_path, monkeypatch):
    (tmp_path / "ck").mkdir()
    os.symlink(tmp_path / "ck", tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    spellings = [
        "ck",
        "ck/",
        str(tmp_path / "ck"),
        f"{tmp_path}/x/../ck",
        f"file:{tmp_path}/ck",
        f"file://{tmp_path}/ck/",
        str(tmp_path / "link"),
    ]
    assert {normalize_location(s) for s in spellings} == {f"file://{tmp_path}/ck"}
    assert normalize_location("s3a://Bucket/ck/./a/../") == "s3://bucket/ck"
    assert normalize_location("hdfs://nn:8020/ck//x/") == "hdfs://nn:8020/ck/x"


def test_hadoops_file_spelling_is_a_local_path(tmp_path):
    assert resolve_uri(f"file:{tmp_path}/ck") == f"file://{tmp_path}/ck"


def test_a_state_file_is_created_once_and_a_second_writer_fails(tmp_path):
    location = resolve_uri(str(tmp_path / "state"))
    first, second = StateDirectory(location), StateDirectory(location)
    first.write("0000000000.manifest.json", [{"uri": "a"}])
    with pytest.raises(StateFileExists, match="two drivers are using one state location"):
        second.write("0000000000.manifest.json", [{"uri": "b"}])
    assert second.read("0000000000.manifest.json") == [{"uri": "a"}]
    # no temporary file is left behind by either writer
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["0000000000.manifest.json"]


def test_a_claim_written_meanwhile_by_another_writer_is_compared(tmp_path):
    location = resolve_uri(str(tmp_path / "state"))
    StateDirectory(location).write(StateDirectory.IDENTITY, {"path": "a"})
    StateDirectory(location).claim({"path": "a"})
