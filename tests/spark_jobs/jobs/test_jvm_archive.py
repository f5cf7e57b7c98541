from pathlib import Path

import pytest

from spark_jobs.jobs import jvm_archive


def test_the_archive_is_named_by_the_jdk_and_spark_it_holds(tmp_path, monkeypatch):
    first = jvm_archive.archive_path(tmp_path)
    assert first.parent == tmp_path
    assert first.name.startswith("driver-") and first.suffix == ".jsa"
    assert jvm_archive.archive_path(tmp_path) == first
    # The JDK echoes JAVA_TOOL_OPTIONS in its version banner: that does not rename it.
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Dignored=1")
    assert jvm_archive.archive_path(tmp_path) == first


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("", "-XX:SharedArchiveFile=/a/driver.jsa -Xlog:cds*=off"),
        (
            "-XX:TieredStopAtLevel=1",
            "-XX:TieredStopAtLevel=1 -XX:SharedArchiveFile=/a/driver.jsa -Xlog:cds*=off",
        ),
    ],
)
def test_java_options_map_the_archive_after_the_callers_own(base, expected):
    assert jvm_archive.java_options(Path("/a/driver.jsa"), base) == expected


def test_an_existing_archive_is_used_as_it_is(tmp_path, monkeypatch):
    path = jvm_archive.archive_path(tmp_path)
    path.write_bytes(b"archive")
    monkeypatch.setattr(jvm_archive, "_build", lambda *_: pytest.fail("rebuilt"))
    assert jvm_archive.ensure_archive(tmp_path) == path
    assert path.read_bytes() == b"archive"


def test_the_console_command_prints_the_conf_that_maps_the_archive(tmp_path, monkeypatch, capsys):
    made = tmp_path / "driver-x.jsa"
    monkeypatch.setattr(jvm_archive, "ensure_archive", lambda directory: made)
    assert jvm_archive.main(["--directory", str(tmp_path)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == (
        f"--conf spark.driver.extraJavaOptions=-XX:SharedArchiveFile={made} -Xlog:cds*=off"
    )
