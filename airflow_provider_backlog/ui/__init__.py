"""The Backlog view in Airflow's UI: server-rendered pages with inline SVG charts of what the
metrics tables say about each job. No JavaScript and no build step, so the pages work
offline and in any browser Airflow supports; an Airflow plugin serves them."""
