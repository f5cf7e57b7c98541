"""Pipelines and their entry points (spark-submit files and console commands)."""
