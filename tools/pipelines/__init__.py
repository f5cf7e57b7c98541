"""The pipelines run from the other tools as a user runs them, and what their metrics say."""
