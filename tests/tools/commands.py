"""What a ``scripts/<name>`` wrapper of a tool must be: executable, running its module
through ``scripts/tool``, and the module answering ``--help`` under the script's name."""

import os
import subprocess
import sys

from tools import REPOSITORY


def assert_script_runs_module(name: str, module: str, usage: str) -> None:
    """``scripts/<name>`` runs ``tools.<module>`` (through scripts/tool, which sets up .venv
    first, so the script itself is not run here), whose help starts with ``usage``."""
    script = REPOSITORY / "scripts" / name
    assert script.is_file() and os.access(script, os.X_OK)
    assert f'tool" {module} "$@"' in script.read_text()
    command = [sys.executable, "-m", f"tools.{module}", "--help"]
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True)
    assert result.returncode == 0
    assert result.stdout.startswith(f"usage: {usage}")
