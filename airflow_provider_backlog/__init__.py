"""The Airflow side of backlog-aware checkpointing: operators and sensors for phased jobs.

It reads the metrics tables through ``spark_jobs.metrics.schema`` only and never imports
pyspark, so Airflow workers need no Spark.
"""
