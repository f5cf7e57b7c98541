"""The demos a person runs: scripts/demo (the DAG in Airflow), scripts/job-demo (the job)."""
