"""Merging a change stream into a SQL table, batch by batch, exactly once."""
