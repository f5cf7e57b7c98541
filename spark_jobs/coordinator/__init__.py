"""The driver side: listens to the query, decides, applies decisions and records them."""
