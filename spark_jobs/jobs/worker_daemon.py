"""Spark's Python worker daemon, run as ``spark.python.daemon.module``: PySpark's own
(``pyspark.daemon``), after taking the zip copies of the installed PySpark off the path
(``python_path``), so that the daemon and the workers it forks import compiled PySpark."""

from spark_jobs.jobs.python_path import prefer_installed_pyspark

if __name__ == "__main__":
    prefer_installed_pyspark()
    from pyspark.daemon import manager

    manager()
