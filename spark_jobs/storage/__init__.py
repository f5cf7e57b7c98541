"""Where durable state lives, below the sources and the metrics: file systems and URIs,
state files created once, and the errors that say a database is away."""
