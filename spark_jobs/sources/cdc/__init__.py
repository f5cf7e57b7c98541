"""Change data capture from PostgreSQL through a logical replication slot, without Spark."""
