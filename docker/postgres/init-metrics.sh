#!/usr/bin/env bash
# Creates the backlog metrics database and the user the jobs and Airflow's
# backlog_metrics_default connection write and read it with. Run by the postgres image once,
# when its data volume is first initialised (mounted into /docker-entrypoint-initdb.d), as
# the superuser POSTGRES_USER, which owns Airflow's metadata database POSTGRES_DB.
set -euo pipefail
: "${METRICS_DB_NAME:?}" "${METRICS_DB_USER:?}" "${METRICS_DB_PASSWORD:?}"

# psql variables (:"name" quotes an identifier, :'name' a literal) keep the values out of the
# SQL text whatever characters they hold.
psql --no-psqlrc --set ON_ERROR_STOP=1 --username "${POSTGRES_USER}" --dbname "${POSTGRES_DB}" \
    --set metrics_db="${METRICS_DB_NAME}" --set metrics_user="${METRICS_DB_USER}" \
    --set metrics_password="${METRICS_DB_PASSWORD}" --set airflow_db="${POSTGRES_DB}" <<'SQL'
CREATE ROLE :"metrics_user" LOGIN PASSWORD :'metrics_password';
CREATE DATABASE :"metrics_db" OWNER :"metrics_user";
-- Each user reaches its own database only: the metrics user is what the Spark drivers get.
REVOKE CONNECT ON DATABASE :"metrics_db" FROM PUBLIC;
REVOKE CONNECT ON DATABASE :"airflow_db" FROM PUBLIC;
SQL
echo "init-metrics: database ${METRICS_DB_NAME} owned by ${METRICS_DB_USER}"
