"""Spark Python streaming data sources that report their backlog phase in their offsets."""
