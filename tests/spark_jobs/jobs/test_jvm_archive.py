import fcntl
import subprocess
from pathlib import Path

import pytest

from spark_jobs.jobs import jvm_archive
from spark_jobs.storage import lock_files


def test_the_archive_is_named_by_the_jdk_and_spark_it_holds(tmp_path, monkeypatch):
    first = jvm_archive.archive_path(tmp_path)
    assert first.parent == tmp_path
    assert first.name.startswith("driver-") and first.suffix == ".jsa"
    assert jvm_archive.archive_path(tmp_path) == first
    # The JDK echoes JAVA_TOOL_OPTIONS in its version banner: that does not rename it.
    jvm_archive._installation.cache_clear()
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Dignored=1")
    assert jvm_archive.archive_path(tmp_path) == first


def test_the_jdk_is_asked_once_per_process(tmp_path, monkeypatch):
    asked = []
    run = subprocess.run

    def counted(command, **kwargs):
        asked.append(command)
        return run(command, **kwargs)

    monkeypatch.setattr(subprocess, "run", counted)
    jvm_archive._installation.cache_clear()
    paths = {jvm_archive.archive_path(tmp_path / str(n)).name for n in range(3)}
    assert len(paths) == 1
    assert asked == [["java", "-version"]]


def test_a_new_archive_replaces_other_installations_files_and_keeps_its_lock(tmp_path):
    path = tmp_path / "driver-new.jsa"
    stale = ["driver-old.jsa", "driver-old.lock", "driver-old.partial", "driver-older.lock"]
    for name in [*stale, "driver-new.lock", "driver-new.partial", "notes.txt"]:
        (tmp_path / name).write_text(name)
    jvm_archive._install(tmp_path / "driver-new.partial", path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "driver-new.jsa",
        "driver-new.lock",
        "notes.txt",
    ]
    assert path.read_text() == "driver-new.partial"


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


def test_another_installation_making_its_archive_keeps_its_files(tmp_path):
    """Two JDKs, one directory: the other's build holds its lock, so its lock and its
    partial archive stay (removing the lock would let a second builder of it start)."""
    for name in ["driver-other.lock", "driver-other.partial", "driver-new.partial"]:
        (tmp_path / name).write_text(name)
    other = lock_files.acquire(tmp_path / "driver-other.lock", fcntl.LOCK_EX, 0)
    assert other is not None
    with other:
        jvm_archive._install(tmp_path / "driver-new.partial", tmp_path / "driver-new.jsa")
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "driver-new.jsa",
            "driver-other.lock",
            "driver-other.partial",
        ]
