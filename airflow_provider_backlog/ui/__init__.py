"""The Backlog view: server-rendered pages of the metrics tables, served in Airflow's UI by
the plugin in airflow_provider_backlog/plugins."""
