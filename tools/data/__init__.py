"""Test data the other tools write (events, CDC tables, samples) and the checks of what came out."""
