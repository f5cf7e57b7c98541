"""The wheel an Airflow worker installs, built by the command docs/airflow.md gives, from the
files a clone of this repository holds: what the worker loads from it must be in it.

Airflow finds the provider and the Backlog view by their entry points, the view renders
its pages from templates that are package data, and the launch needs the ``spark`` extra's
pyspark for spark-submit. The command and the wheel's name are read from the page, so the
page stays true.
"""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "airflow.md"
BUILD = re.compile(r"^    (\.venv/bin/python -m pip wheel .*)$", re.MULTILINE)
INSTALLED_WHEEL = re.compile(r"'dist/([^'\[]+\.whl)\[[^']*\]'")
TEMPLATES = "airflow_provider_backlog/ui/templates/"


def documented_build() -> list[str]:
    """The page's build command, run with this interpreter (the venv's python)."""
    (command,) = BUILD.findall(PAGE.read_text(encoding="utf-8"))
    program, *arguments = shlex.split(command)
    assert program == ".venv/bin/python"
    return [sys.executable, *arguments]


def clone_files() -> list[str]:
    """The repository's files that a clone has: tracked, or new and not ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    """The wheel the documented command builds in a copy of the clone's files."""
    clone = tmp_path_factory.mktemp("clone")
    for name in clone_files():
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, clone / name)
    subprocess.run(documented_build(), cwd=clone, capture_output=True, check=True)
    (built,) = (clone / "dist").glob("*.whl")
    with zipfile.ZipFile(built) as opened:
        yield opened


def test_the_wheel_is_the_one_the_page_installs(wheel: zipfile.ZipFile) -> None:
    (named,) = INSTALLED_WHEEL.findall(PAGE.read_text(encoding="utf-8"))
    assert Path(wheel.filename).name == named


def test_the_wheel_holds_every_template_of_the_backlog_view(wheel: zipfile.ZipFile) -> None:
    in_clone = {name for name in clone_files() if name.startswith(TEMPLATES)}
    assert f"{TEMPLATES}base.html" in in_clone
    assert {name for name in wheel.namelist() if name.startswith(TEMPLATES)} == in_clone


def test_airflow_finds_the_provider_and_its_view_by_the_wheels_entry_points(
    wheel: zipfile.ZipFile,
) -> None:
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    groups = configparser.ConfigParser()
    groups.read_string(wheel.read(entry_points).decode())
    assert dict(groups["apache_airflow_provider"]) == {
        "provider_info": "airflow_provider_backlog:get_provider_info"
    }
    assert dict(groups["airflow.plugins"]) == {
        "backlog": "airflow_provider_backlog.plugins.backlog_view:BacklogViewPlugin"
    }


def test_the_spark_extra_brings_pyspark_and_with_it_spark_submit(wheel: zipfile.ZipFile) -> None:
    (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    requirements = [
        line.removeprefix("Requires-Dist: ")
        for line in wheel.read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist: pyspark")
    ]
    assert requirements == ['pyspark==4.3.*; extra == "spark"']


def test_the_wheel_leaves_the_repository_tools_out(wheel: zipfile.ZipFile) -> None:
    assert not [name for name in wheel.namelist() if name.startswith(("tools/", "tests/"))]
