"""Fails an image build of the stack whose Python or pyspark would break a job at run time.

    python3.11 check_image.py 3.11 spark_jobs airflow_provider_backlog

The interpreter that runs it must be the one the Spark side runs (the name PYSPARK_PYTHON
gives): its minor version must be the one both images agree on, since PySpark refuses
executors whose Python differs from the driver's; the modules given must import; pyspark must
be the full distribution with its jars, and pyspark-client must not be installed over it (see
docs/airflow.md).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pathlib
import sys


def problems(python_version: str, modules: list[str]) -> list[str]:
    found = []
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if running != python_version:
        found.append(
            f"{sys.executable} is Python {running}, the stack runs Python {python_version} on "
            "both the driver and the executors"
        )
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as error:
            found.append(f"{module} does not import: {error}")
    try:
        importlib.metadata.version("pyspark-client")
        found.append("pyspark-client is installed: it puts an older release's files over pyspark's")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        import pyspark
    except ImportError as error:
        found.append(f"pyspark does not import: {error}")
    else:
        jars = pathlib.Path(pyspark.__file__).parent / "jars"
        if not any(jars.glob("spark-core_*.jar")):
            found.append(f"pyspark has no jars in {jars}: the full distribution is needed")
    return found


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: check_image.py PYTHON_VERSION [MODULE ...]", file=sys.stderr)
        return 2
    found = problems(argv[0], argv[1:])
    for problem in found:
        print(f"check_image: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
