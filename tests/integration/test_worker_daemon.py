import sys
from pathlib import Path

import pyspark


def where_workers_import_pyspark(_: int) -> tuple[str, list[str]]:
    import pyspark as worker_pyspark

    return worker_pyspark.__file__, [entry for entry in sys.path if entry.endswith(".zip")]


def test_python_workers_import_the_installed_pyspark_not_its_zip_copy(spark):
    """Spark starts workers with $SPARK_HOME/python/lib/pyspark.zip first on their path; our
    daemon takes it off, so they import compiled PySpark (spark_jobs/jobs/python_path.py)."""
    found = spark.sparkContext.parallelize(range(2), 2).map(where_workers_import_pyspark).collect()
    for module_file, zips in found:
        assert module_file == pyspark.__file__
        assert not [entry for entry in zips if Path(entry).name == "pyspark.zip"]
