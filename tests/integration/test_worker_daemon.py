import json
import sys
from pathlib import Path

import pyspark
from pyspark.sql.datasource import DataSource, DataSourceReader


def where_workers_import_pyspark(_: int) -> tuple[str, list[str]]:
    import pyspark as worker_pyspark

    return worker_pyspark.__file__, [entry for entry in sys.path if Path(entry).is_file()]


def test_python_workers_import_the_installed_pyspark_not_its_zip_copy(spark):
    """Spark starts workers with $SPARK_HOME/python/lib/pyspark.zip first on their path; our
    daemon takes it off, so they import compiled PySpark (spark_jobs/jobs/python_path.py)."""
    found = spark.sparkContext.parallelize(range(2), 2).map(where_workers_import_pyspark).collect()
    for module_file, zips in found:
        assert module_file == pyspark.__file__
        assert not [entry for entry in zips if Path(entry).name == "pyspark.zip"], zips


class WhereImported(DataSource):
    """A data source whose planning says, from Spark's planner process, where that process
    imported PySpark from: Spark starts it with PySpark's own daemon, not ours."""

    @classmethod
    def name(cls) -> str:
        return "where_imported"

    def schema(self) -> str:
        import pyspark as planner_pyspark

        zips = [entry for entry in sys.path if Path(entry).name == "pyspark.zip"]
        zips = [entry for entry in zips if Path(entry).is_file()]  # an entry may name none
        Path(self.options["report"]).write_text(json.dumps([planner_pyspark.__file__, zips]))
        return "id int"

    def reader(self, schema):  # type: ignore[no-untyped-def]
        return OneRow()


class OneRow(DataSourceReader):
    def read(self, partition):  # type: ignore[no-untyped-def]
        yield (1,)


def test_spark_s_planner_processes_import_the_installed_pyspark_too(spark, tmp_path):
    """They have Spark's zip copy first on their path unless SPARK_HOME is the compiled
    home (spark_jobs/jobs/spark_home.py), which the session here starts from, as the
    console commands, the launch operator and the tools do."""
    spark.dataSource.register(WhereImported)
    report = tmp_path / "report.json"
    assert spark.read.format("where_imported").option("report", str(report)).load().count() == 1
    module_file, zips = json.loads(report.read_text())
    assert (module_file, zips) == (pyspark.__file__, [])
