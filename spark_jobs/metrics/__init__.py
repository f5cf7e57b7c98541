"""Where a job records its checkpoints and backlog transitions, for Airflow and people to read."""
