"""Spark's Python worker daemon, run as ``spark.python.daemon.module``: PySpark's own
(``pyspark.daemon``), after taking the zip copies of the installed PySpark off the path
(``python_path``), so that the daemon and the workers it forks import compiled PySpark."""

from spark_jobs.jobs.python_path import prefer_installed_pyspark

#: The Spark conf that starts Python workers from this module: set by the launch operator,
#: the console commands and the tools, from here.
DAEMON_CONF = ("spark.python.daemon.module", "spark_jobs.jobs.worker_daemon")

if __name__ == "__main__":
    prefer_installed_pyspark()
    from pyspark.daemon import manager

    manager()
