"""PySpark from the installed package, not from the copy Spark puts ahead of it.

Spark starts each of its Python processes (workers, data source planners, the driver under
spark-submit) with ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on
``PYTHONPATH``. For a pip-installed PySpark, SPARK_HOME is the installed package, so those
zips are a second copy of it, of source files only: an import from a zip cannot cache
compiled code, so every process compiles what it imports of PySpark again (0.6-0.8 s on a
2-core machine, against 0.12 s from the installed package), and each task's
``importlib.invalidate_caches()`` re-reads the 4 MB zip's index. Dropping the zips is safe
exactly when they lie inside an installed ``pyspark`` package that is itself on the path:
then they are that package's own copy, of the same release.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def installed_copies(
    path: Sequence[str], is_file: Callable[[Path], bool] = Path.is_file
) -> list[str]:
    """The entries of ``path`` that are zips under ``<dir>/pyspark/python/lib`` while
    ``<dir>`` is on ``path`` too and holds that package (its ``__init__.py``)."""
    directories = {str(Path(entry)) for entry in path if not entry.endswith(".zip")}
    copies = []
    for entry in path:
        zipped = Path(entry)
        if zipped.suffix != ".zip" or zipped.parent.parts[-3:] != ("pyspark", "python", "lib"):
            continue
        package = zipped.parents[2]
        if str(package.parent) in directories and is_file(package / "__init__.py"):
            copies.append(entry)
    return copies


def prefer_installed_pyspark() -> None:
    """Take the installed package's zip copies off ``sys.path`` (and forget their
    importers), unless PySpark is imported already: one process must not mix the two."""
    if "pyspark" in sys.modules:
        return
    for entry in installed_copies(sys.path):
        sys.path.remove(entry)
        sys.path_importer_cache.pop(entry, None)
