"""Repository tools, a package per purpose: ``services`` (broker, PostgreSQL, Spark cluster on
loopback), ``data`` (synthetic inputs and output checks), ``pipelines`` (the jobs run as a
user runs them, their summaries and charts), ``demo``, ``benchmarks``, ``faults`` (the fault
campaign and the soak) and ``flink`` (the Flink peer). docs/testing.md has the table.

They are not installed by the wheel, which ships to every cluster node and Airflow worker and
holds only ``airflow_provider_backlog`` and ``spark_jobs``. Run them from a checkout:
``scripts/<name>`` (e.g. ``scripts/chaos --help``), or ``python -m tools.<package>.<module>``
with the repository root as the working directory or on PYTHONPATH. (Airflow's
cron-descriptor installs a bare ``tools`` folder into site-packages; this package, a regular
one, takes precedence over it wherever the root is on the path.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

#: The checkout these tools live in.
REPOSITORY = Path(__file__).resolve().parents[1]


def child_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (by default this process's environment) with the checkout first on PYTHONPATH:
    a child ``python -m tools.<package>.<module>`` then imports these tools from any working
    directory."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY), env.get("PYTHONPATH")]))
    return env
