"""Every ``scripts/<name>`` the README and docs/ name exists and is executable; each one that
runs a tool (through ``scripts/tool``) names a module under tools/ that answers ``--help``
under the script's name, and each of the others answers ``--help`` with its header and does
nothing else. Run as a user runs them, from the checkout, without a shell."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tools import REPOSITORY

SCRIPTS = REPOSITORY / "scripts"
NAMED = re.compile(r"\bscripts/([a-z][a-z0-9-]*)")
RUNS_TOOL = re.compile(r'tool"? ([a-z_.]+) "\$@"')


def named_in_docs() -> set[str]:
    pages = [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md"))]
    return {name for page in pages for name in NAMED.findall(page.read_text())}


def tool_wrappers() -> dict[str, str]:
    """Script name -> the module under tools/ it runs."""
    found = {}
    for script in sorted(SCRIPTS.iterdir()):
        if script.name != "tool" and (match := RUNS_TOOL.search(script.read_text())):
            found[script.name] = match.group(1)
    return found


def test_every_script_the_docs_name_is_there_and_executable():
    named = named_in_docs()
    assert {"setup", "test", "demo", "chaos", "benchmark"} <= named
    for name in sorted(named):
        script = SCRIPTS / name
        assert script.is_file() and os.access(script, os.X_OK), f"scripts/{name}"


@pytest.mark.parametrize(("name", "module"), sorted(tool_wrappers().items()))
def test_each_tool_command_answers_help_under_its_name(name, module):
    assert (REPOSITORY / "tools" / f"{module.replace('.', '/')}.py").is_file()
    command = [sys.executable, "-m", f"tools.{module}", "--help"]
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    usage = result.stdout.split("\n", 1)[0]
    assert usage.startswith("usage: ") and name in usage, usage


@pytest.mark.parametrize(
    "name", sorted(p.name for p in SCRIPTS.iterdir() if p.name not in tool_wrappers())
)
def test_each_other_script_answers_help_with_its_header_and_does_nothing_else(name, tmp_path):
    script = SCRIPTS / name
    header = script.read_text().splitlines()[1].removeprefix("# ")
    # From elsewhere, on a PATH without Python or Java: only the help can succeed.
    environment = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHON": "no-such-python"}
    for flag in ("--help", "-h"):
        result = subprocess.run(
            [str(script), flag], cwd=tmp_path, env=environment, capture_output=True,
            text=True, timeout=10,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[0] == header
    assert list(tmp_path.iterdir()) == []


def test_scripts_tool_lists_the_tool_modules_and_refuses_another():
    result = subprocess.run(
        [str(SCRIPTS / "tool"), "no_such_tool"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    listed = result.stderr.split("MODULE one of:", 1)[1].split()
    assert set(tool_wrappers().values()) <= set(listed)
