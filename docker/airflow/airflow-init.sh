#!/usr/bin/env bash
# One-shot setup before the Airflow components start (the airflow-init service): refuses the
# placeholders of .env.example, migrates the metadata database and writes the UI login of
# Airflow's simple auth manager. Safe to run at every `docker compose up`.
set -euo pipefail

fail() { echo "airflow-init: $*" >&2; exit 1; }

# Any value still holding the placeholder (passwords, keys, and the connections built from
# them) means .env was copied but not edited.
placeholders=()
for name in $(compgen -e); do
    if [[ "${!name}" == *CHANGE_ME* ]]; then
        placeholders+=("${name}")
    fi
done
if (( ${#placeholders[@]} )); then
    fail "still the placeholder from .env.example: ${placeholders[*]}; set real values in" \
         ".env (PostgreSQL keeps the passwords it was first started with: if it already ran" \
         "with the placeholders, remove its volume with docker compose down -v)"
fi
: "${AIRFLOW_ADMIN_USERNAME:?}" "${AIRFLOW_ADMIN_PASSWORD:?}"
: "${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:?}"

airflow db migrate

# The simple auth manager reads the users' passwords from this file (JSON: user -> password)
# and would otherwise generate one and print it in the api-server's log. Written atomically,
# readable by the airflow user only, from the current .env at every start.
umask 077
python3 - <<'PY'
import json
import os
import pathlib

path = pathlib.Path(os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"])
passwords = {os.environ["AIRFLOW_ADMIN_USERNAME"]: os.environ["AIRFLOW_ADMIN_PASSWORD"]}
temporary = path.with_name(f".{path.name}.tmp")
temporary.write_text(json.dumps(passwords) + "\n")
temporary.replace(path)
PY
echo "airflow-init: database migrated; UI login: ${AIRFLOW_ADMIN_USERNAME}"
