"""docker-compose.yaml, checked without a Docker engine.

First docker-compose's own validation: `docker-compose config` parses, validates and
interpolates the file without contacting a daemon (scripts/install-test-tools installs it; the
test skips without it). Then the stack's agreement with the rest of the project, in plain
Python: image tags against the pins in constraints.txt, ports, host names, URLs and paths
against each other, the DAG's resource profiles and the Dockerfiles. Each check returns the
problems it finds, naming the service and the value; the last tests break a copy of the stack
in one place each and expect the check to name it.
"""

from __future__ import annotations

import ast
import configparser
import copy
import fnmatch
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from unittest import mock
from urllib.parse import urlsplit

import pytest
import yaml
from sqlalchemy.engine import make_url

from tests.support.prerequisites import missing
from tools.demo import airflow_demo

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yaml"
ENV_EXAMPLE = REPO / ".env.example"
DAGS = REPO / "dags"
#: PostgreSQL's port in the official image (the stack sets no other).
POSTGRES_PORT = 5432
#: The placeholder every secret of .env.example holds; airflow-init refuses it.
PLACEHOLDER = "CHANGE_ME"
LONG_RUNNING = {"always", "unless-stopped", "on-failure"}
SECRET_NAME = re.compile(r"(PASSWORD|SECRET|SECRET_KEY|FERNET_KEY)$")
VARIABLE = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<modifier>:?[-?][^}]*)?\}")


# --- the stack as written ------------------------------------------------------------------


@dataclass
class Stack:
    """docker-compose.yaml (anchors merged, each service its own copy), .env.example, and the
    files the checks compare it with."""

    text: str
    compose: dict
    env: dict[str, str]
    dockerfiles: dict[str, str]
    constraints: dict[str, str]
    version: str
    profiles: dict[str, dict[str, object]]

    @property
    def services(self) -> dict[str, dict]:
        return self.compose["services"]

    def resolve(self, value: object) -> str:
        """A value as docker-compose interpolates it from .env.example."""

        def variable(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            name, modifier = match.group("name"), match.group("modifier") or ""
            value = self.env.get(name)
            missing = value is None or (modifier.startswith(":") and not value)
            if missing and modifier.lstrip(":").startswith("-"):
                return modifier.lstrip(":")[1:]
            if missing:
                raise KeyError(f"${{{name}}} is not set in .env.example")
            return value

        return VARIABLE.sub(variable, str(value))

    def environment(self, service: str) -> dict[str, str]:
        raw = self.services[service].get("environment") or {}
        if isinstance(raw, list):
            raw = dict(item.split("=", 1) for item in raw)
        return {key: self.resolve(value) for key, value in raw.items()}

    def command(self, service: str) -> list[str]:
        command = self.services[service].get("command") or []
        return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]

    def mounts(self, service: str) -> list[tuple[str, str]]:
        """(source, target) of each volume entry: a named volume, or a host path."""
        found = []
        for entry in self.services[service].get("volumes") or []:
            if isinstance(entry, dict):
                found.append((str(entry.get("source", "")), str(entry["target"])))
            else:
                source, target = self.resolve(entry).split(":")[:2]
                found.append((source, target))
        return found

    def services_running(self, marker: str) -> list[str]:
        """Services whose command (or entrypoint) contains ``marker``."""
        return [
            name
            for name, service in self.services.items()
            if marker in self.command(name) or marker in (service.get("entrypoint") or [])
        ]

    def dockerfile_of(self, service: str) -> str | None:
        build = self.services[service].get("build")
        if not build:
            return None
        context = build if isinstance(build, str) else build.get("context", ".")
        dockerfile = (
            "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
        )
        return os.path.normpath(os.path.join(context, dockerfile))

    def dockerfile_from(self, image_name: str) -> tuple[str, str]:
        """(path, text) of the Dockerfile built on ``image_name``."""
        for path, text in self.dockerfiles.items():
            if any(image.split(":")[0] == image_name for image in base_images(text)):
                return path, text
        raise AssertionError(f"no Dockerfile under docker/ is built FROM {image_name}")


def parse_env_file(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs if not key.startswith("#")}


def parse_constraints(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.split("==", 1)
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def dag_profiles() -> dict[str, dict[str, object]]:
    """The PhaseProfile(...) keywords of every DAG module, by the name they are assigned to."""
    profiles = {}
    for path in sorted(DAGS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", None) == "PhaseProfile"
            ):
                keywords = {
                    k.arg: k.value.value
                    for k in node.value.keywords
                    if isinstance(k.value, ast.Constant)
                }
                for target in node.targets:
                    profiles[f"{path.name}:{target.id}"] = keywords
    return profiles


def load_stack() -> Stack:
    text = COMPOSE_FILE.read_text()
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    return Stack(
        text=text,
        # Through JSON: services that share an anchor get copies a test may change alone.
        compose=json.loads(json.dumps(yaml.safe_load(text))),
        env=parse_env_file(ENV_EXAMPLE.read_text()),
        dockerfiles={
            str(path.relative_to(REPO)): path.read_text()
            for path in sorted((REPO / "docker").rglob("Dockerfile"))
        },
        constraints=parse_constraints((REPO / "constraints.txt").read_text()),
        version=setup["metadata"]["version"],
        profiles=dag_profiles(),
    )


@pytest.fixture(scope="module")
def stack() -> Stack:
    return load_stack()


# --- Dockerfiles -----------------------------------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """(instruction, arguments) of a Dockerfile, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def global_args(text: str) -> dict[str, str]:
    """ARG defaults declared before the first FROM, which FROM lines may use."""
    args = {}
    for keyword, rest in instructions(text):
        if keyword == "FROM":
            break
        if keyword == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            args[name] = value
    return args


def base_images(text: str) -> list[str]:
    """Every image a Dockerfile pulls: FROM lines and COPY --from=<image>, stages left out."""
    args, stages, images = global_args(text), set(), []
    for keyword, rest in instructions(text):
        words = rest.split()
        if keyword == "FROM":
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), words[0])
            if image not in stages:
                images.append(image)
            if len(words) == 3 and words[1].upper() == "AS":
                stages.add(words[2])
        elif keyword == "COPY":
            for word in words:
                if word.startswith("--from=") and word[7:] not in stages:
                    images.append(word[7:])
    return images


def copied_to(text: str) -> list[tuple[str, str]]:
    """(source, destination) of each build-context path COPY or ADD copies (not those copied
    from a stage or image)."""
    copies = []
    for keyword, rest in instructions(text):
        words = rest.split()
        if keyword in ("COPY", "ADD") and not any(word.startswith("--from=") for word in words):
            paths = [word for word in words if not word.startswith("--")]
            copies += [(source, paths[-1]) for source in paths[:-1]]
    return copies


def copied_sources(text: str) -> list[str]:
    """The build-context paths of COPY and ADD (not those copied from a stage or image)."""
    return [source for source, _ in copied_to(text)]


def excluded_by_dockerignore(context: Path, path: str) -> str | None:
    """The .dockerignore pattern of ``context`` that leaves ``path`` out, if any."""
    ignore = context / ".dockerignore"
    if not ignore.exists():
        return None
    patterns = [
        line.strip().strip("/")
        for line in ignore.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert not any(p.startswith("!") for p in patterns), "exceptions (!) are not supported here"
    parts = Path(os.path.normpath(path)).parts
    for pattern in patterns:
        for end in range(1, len(parts) + 1):
            candidate = "/".join(parts[:end])
            if fnmatch.fnmatchcase(candidate, pattern) or (
                pattern.startswith("**/") and fnmatch.fnmatchcase(parts[end - 1], pattern[3:])
            ):
                return pattern
    return None


def python_version_of_spark_image(stack: Stack) -> str:
    _, text = stack.dockerfile_from("apache/spark")
    return global_args(text)["PYTHON_VERSION"]


# --- the checks ------------------------------------------------------------------------------


def check_images_are_pinned(stack: Stack) -> list[str]:
    problems = []
    images = [(f"service {name}", service.get("image")) for name, service in stack.services.items()]
    for path, text in stack.dockerfiles.items():
        images += [(path, image) for image in base_images(text)]
    for where, image in images:
        if not image:
            problems.append(f"{where}: no image named")
            continue
        tag = image.split("/")[-1].split("@")[0].partition(":")[2]
        if not tag or tag == "latest" or "$" in image:
            problems.append(f"{where}: image {image} is not pinned to a version")
    for name, service in stack.services.items():
        image = service.get("image", "")
        if service.get("build") and not image.endswith(f":{stack.version}"):
            problems.append(
                f"service {name}: built image {image} is not tagged with the project's version "
                f"{stack.version} (setup.cfg)"
            )
    return problems


def check_airflow_image_matches_the_pins(stack: Stack) -> list[str]:
    path, text = stack.dockerfile_from("apache/airflow")
    [image] = [i for i in base_images(text) if i.startswith("apache/airflow:")]
    match = re.fullmatch(r"apache/airflow:(?P<airflow>[\d.]+)-python(?P<python>\d+\.\d+)", image)
    if not match:
        return [f"{path}: {image} is not apache/airflow:<version>-python<X.Y>"]
    problems = []
    if match["airflow"] != stack.constraints["apache-airflow"]:
        problems.append(
            f"{path}: {image} is Airflow {match['airflow']}, constraints.txt pins "
            f"apache-airflow=={stack.constraints['apache-airflow']}"
        )
    spark_python = python_version_of_spark_image(stack)
    if match["python"] != spark_python:
        problems.append(
            f"{path}: {image} runs Python {match['python']}, the Spark image's executors run "
            f"Python {spark_python} (PYTHON_VERSION in docker/spark/Dockerfile)"
        )
    if f"check_image.py {match['python']} " not in " ".join(a for _, a in instructions(text)):
        problems.append(f"{path}: check_image.py does not check Python {match['python']}")
    for name in stack.services:
        for variable in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
            value = stack.environment(name).get(variable)
            if value is not None and value != f"python{spark_python}":
                problems.append(
                    f"service {name}: {variable}={value}, not python{spark_python}: the "
                    "executors must run the driver's Python minor version"
                )
    return problems


def check_spark_image_matches_the_pins(stack: Stack) -> list[str]:
    path, text = stack.dockerfile_from("apache/spark")
    [image] = [i for i in base_images(text) if i.startswith("apache/spark:")]
    version = image.split(":")[1].split("-")[0]
    problems = []
    if version != stack.constraints["pyspark"]:
        problems.append(
            f"{path}: {image} is Spark {version}, constraints.txt pins "
            f"pyspark=={stack.constraints['pyspark']}"
        )
    for name in stack.services_running("/opt/spark/bin/spark-class"):
        if stack.dockerfile_of(name) != path:
            problems.append(f"service {name} runs Spark but is not built from {path}")
    return problems


def option(command: list[str], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


def check_spark_master_and_workers_agree(stack: Stack) -> list[str]:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    masters = stack.services_running("org.apache.spark.deploy.master.Master")
    workers = stack.services_running("org.apache.spark.deploy.worker.Worker")
    if len(masters) != 1 or len(workers) < 1:
        return [f"expected one Spark master and workers, found {masters} and {workers}"]
    [master] = masters
    problems = []
    port = option(stack.command(master), "--port")
    url = f"spark://{master}:{port}"
    for name in [master, *workers]:
        host = option(stack.command(name), "--host")
        hostname = stack.services[name].get("hostname")
        if not host == hostname == name:
            problems.append(
                f"service {name}: --host {host} and hostname {hostname} must both be the "
                "service's name, which the other containers resolve"
            )
    for name in workers:
        if stack.command(name)[-1] != url:
            problems.append(f"service {name}: registers with {stack.command(name)[-1]}, not {url}")
    for name in stack.services:
        value = stack.environment(name).get("AIRFLOW_CONN_SPARK_DEFAULT")
        if value is None:
            continue
        try:
            with mock.patch.dict(os.environ, {"AIRFLOW_CONN_SPARK_DEFAULT": value}):
                connection = SparkSubmitHook(conn_id="spark_default")._connection
        except Exception as error:
            problems.append(f"service {name}: AIRFLOW_CONN_SPARK_DEFAULT does not parse: {error}")
            continue
        if (connection["master"], connection["deploy_mode"]) != (url, "client"):
            problems.append(
                f"service {name}: AIRFLOW_CONN_SPARK_DEFAULT gives master "
                f"{connection['master']} in deploy mode {connection['deploy_mode']}, not {url} "
                "in client mode"
            )
    return problems


def check_the_scheduler_is_reachable_by_executors(stack: Stack) -> list[str]:
    problems = []
    for name in stack.services_running("scheduler"):
        local = stack.environment(name).get("SPARK_LOCAL_HOSTNAME")
        hostname = stack.services[name].get("hostname")
        if not local == hostname == name:
            problems.append(
                f"service {name}: SPARK_LOCAL_HOSTNAME {local} and hostname {hostname} must "
                "both be the service's name: executors connect back to the driver by it"
            )
    return problems


def listeners(value: str) -> dict[str, tuple[str, int]]:
    found = {}
    for listener in value.split(","):
        parsed = urlsplit(listener)
        found[parsed.scheme.upper()] = (parsed.hostname or "", parsed.port or 0)
    return found


def check_kafka_agrees_with_the_dag_environment(stack: Stack) -> list[str]:
    brokers = [n for n in stack.services if "KAFKA_ADVERTISED_LISTENERS" in stack.environment(n)]
    if len(brokers) != 1:
        return [f"expected one Kafka broker, found {brokers}"]
    [broker] = brokers
    env = stack.environment(broker)
    host, port = listeners(env["KAFKA_ADVERTISED_LISTENERS"])["PLAINTEXT"]
    problems = []
    if host != broker:
        problems.append(f"service {broker}: advertises {host}, not its service name {broker}")
    if listeners(env["KAFKA_LISTENERS"]).get("PLAINTEXT", ("", 0))[1] != port:
        problems.append(
            f"service {broker}: KAFKA_LISTENERS {env['KAFKA_LISTENERS']} does not listen on "
            f"the advertised port {port}"
        )
    servers = f"{host}:{port}"
    topics = set()
    for name in stack.services:
        given = stack.environment(name).get("BACKLOG_KAFKA_BOOTSTRAP_SERVERS")
        if given is not None and given != servers:
            problems.append(
                f"service {name}: BACKLOG_KAFKA_BOOTSTRAP_SERVERS={given}, not {servers}"
            )
        if "BACKLOG_KAFKA_TOPIC" in stack.environment(name):
            topics.add(stack.environment(name)["BACKLOG_KAFKA_TOPIC"])
    creators = stack.services_running("--create")
    if len(topics) != 1 or not creators:
        return [*problems, f"expected one BACKLOG_KAFKA_TOPIC and its creation, found {topics}"]
    [topic] = topics
    for name in creators:
        command = stack.command(name)
        created = (option(command, "--bootstrap-server"), option(command, "--topic"))
        if created != (servers, topic):
            problems.append(f"service {name}: creates {created[1]} at {created[0]}, not {topic}")
        if option(command, "--partitions") != str(airflow_demo.PARTITIONS):
            problems.append(
                f"service {name}: creates {option(command, '--partitions')} partitions, not "
                f"{airflow_demo.PARTITIONS} as the demo's topic"
            )
    return problems


def check_the_dags_read_the_environment_the_stack_sets(stack: Stack) -> list[str]:
    dags = {path.name: path.read_text() for path in DAGS.glob("*.py")}
    names = {
        variable
        for name in stack.services_running("scheduler")
        for variable in stack.environment(name)
        if variable.startswith("BACKLOG_")
    }
    return [
        f"no DAG in dags/ reads {variable}, which the stack sets for it"
        for variable in sorted(names)
        if not any(f'"{variable}"' in text for text in dags.values())
    ]


def check_the_databases_agree_with_postgres(stack: Stack) -> list[str]:
    from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook

    servers = [n for n in stack.services if "POSTGRES_PASSWORD" in stack.environment(n)]
    if len(servers) != 1:
        return [f"expected one PostgreSQL service, found {servers}"]
    [server] = servers
    env = stack.environment(server)
    problems = []
    scripts = [s for s, t in stack.mounts(server) if t.startswith("/docker-entrypoint-initdb.d/")]
    for script in scripts:
        text = (REPO / script).read_text() if (REPO / script).is_file() else ""
        if not os.access(REPO / script, os.X_OK):
            problems.append(
                f"service {server}: init script {script} is not executable, so the image would "
                "source it into its own shell"
            )
        for variable in ("METRICS_DB_NAME", "METRICS_DB_USER", "METRICS_DB_PASSWORD"):
            if "${" + variable not in text:
                problems.append(f"service {server}: init script {script} does not use {variable}")
    if not scripts:
        problems.append(f"service {server}: no init script in /docker-entrypoint-initdb.d")
    expected = {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": (
            env["POSTGRES_USER"],
            env["POSTGRES_PASSWORD"],
            env["POSTGRES_DB"],
        ),
        "AIRFLOW_CONN_BACKLOG_METRICS_DEFAULT": (
            env["METRICS_DB_USER"],
            env["METRICS_DB_PASSWORD"],
            env["METRICS_DB_NAME"],
        ),
    }
    for name in stack.services:
        for variable, (user, password, database) in expected.items():
            value = stack.environment(name).get(variable)
            if value is None:
                continue
            try:
                if variable == "AIRFLOW_CONN_BACKLOG_METRICS_DEFAULT":
                    with mock.patch.dict(os.environ, {variable: value}):
                        url = BacklogMetricsHook().sqlalchemy_url
                else:
                    url = make_url(value)
            except Exception as error:
                problems.append(f"service {name}: {variable} does not parse: {error}")
                continue
            found = (url.host, url.port, url.database, url.username)
            wanted = (server, POSTGRES_PORT, database, user)
            if found != wanted:
                problems.append(
                    f"service {name}: {variable} reaches (host, port, database, user) {found}, "
                    f"the postgres service serves {wanted}"
                )
            elif url.password != password:
                problems.append(
                    f"service {name}: {variable} has another password than the postgres "
                    f"service gives {user}"
                )
    return problems


def check_the_data_volume_is_the_data_dir(stack: Stack) -> list[str]:
    dirs = {stack.environment(n).get("BACKLOG_DATA_DIR") for n in stack.services} - {None}
    if len(dirs) != 1:
        return [f"expected one BACKLOG_DATA_DIR for every service, found {sorted(dirs)}"]
    [data_dir] = dirs
    named = set(stack.compose.get("volumes") or {})
    volumes = {
        source
        for name in stack.services
        for source, target in stack.mounts(name)
        if target == data_dir
    }
    problems = []
    if len(volumes) != 1 or not volumes <= named:
        problems.append(f"{data_dir} is mounted from {sorted(volumes)}, not one named volume")
    needed = [
        *stack.services_running("scheduler"),
        *stack.services_running("org.apache.spark.deploy.worker.Worker"),
        *stack.services_running("tools.data.sample_data"),
    ]
    for name in needed:
        if (next(iter(volumes), None), data_dir) not in stack.mounts(name):
            problems.append(f"service {name}: does not mount the data volume at {data_dir}")
    for name in stack.services:
        for source, target in stack.mounts(name):
            if source in volumes and target != data_dir:
                problems.append(
                    f"service {name}: mounts the data volume at {target}, not {data_dir}"
                )
        dockerfile = stack.dockerfile_of(name)
        if name in needed and dockerfile and data_dir not in stack.dockerfiles.get(dockerfile, ""):
            problems.append(f"{dockerfile}: does not create {data_dir} for service {name}")
    return problems


def check_host_paths_exist(stack: Stack) -> list[str]:
    problems = []
    for name, service in stack.services.items():
        for source, target in stack.mounts(name):
            if source.startswith((".", "/")) and not (REPO / source).exists():
                problems.append(f"service {name}: bind mount {source} (for {target}) is missing")
        build = service.get("build")
        if build:
            context = REPO / (build if isinstance(build, str) else build.get("context", "."))
            if not context.is_dir():
                problems.append(f"service {name}: build context {context} is missing")
            elif not (REPO / stack.dockerfile_of(name)).is_file():
                problems.append(
                    f"service {name}: Dockerfile {stack.dockerfile_of(name)} is missing"
                )
    return problems


def check_dockerfiles_copy_existing_paths(stack: Stack) -> list[str]:
    problems = []
    builds = {
        (stack.dockerfile_of(name), service["build"].get("context", "."))
        for name, service in stack.services.items()
        if isinstance(service.get("build"), dict)
    }
    for dockerfile, context in sorted(builds):
        for source in copied_sources(stack.dockerfiles.get(dockerfile, "")):
            if not (REPO / context / source).exists():
                problems.append(f"{dockerfile}: COPY {source}, which the build context lacks")
            elif pattern := excluded_by_dockerignore(REPO / context, source):
                problems.append(
                    f"{dockerfile}: COPY {source}, which .dockerignore ({pattern}) leaves out"
                )
    return problems


def check_the_images_hold_the_tools_their_services_run(stack: Stack) -> list[str]:
    """The wheel leaves tools/ out: a service that runs ``python -m tools.<module>`` needs its
    image to copy tools/ into the service's working directory, where python -m finds it."""
    problems = []
    for name, service in stack.services.items():
        words = [*(service.get("entrypoint") or []), *stack.command(name)]
        pairs = itertools.pairwise(words)
        modules = [m for flag, m in pairs if flag == "-m" and m.startswith("tools.")]
        for module in modules:
            if not REPO.joinpath(*module.split(".")).with_suffix(".py").is_file():
                problems.append(f"service {name}: runs {module}, which the repository lacks")
            workdir = service.get("working_dir")
            if not workdir:
                problems.append(f"service {name}: runs {module} with no working_dir")
                continue
            dockerfile = stack.dockerfile_of(name)
            wanted = os.path.join(workdir, "tools")
            copies = copied_to(stack.dockerfiles.get(dockerfile, "")) if dockerfile else []
            if not any(
                source.rstrip("/") == "tools" and destination.rstrip("/") == wanted
                for source, destination in copies
            ):
                problems.append(
                    f"service {name}: runs {module}, but {dockerfile} does not copy tools to "
                    f"{wanted} (its working directory's)"
                )
    return problems


def check_long_running_services_are_healthchecked(stack: Stack) -> list[str]:
    problems = []
    completed = {
        target
        for service in stack.services.values()
        for target, need in (service.get("depends_on") or {}).items()
        if isinstance(need, dict) and need.get("condition") == "service_completed_successfully"
    }
    long_running = set()
    for name, service in stack.services.items():
        restart = service.get("restart")
        if restart in LONG_RUNNING:
            long_running.add(name)
            test = (service.get("healthcheck") or {}).get("test")
            if not test or test[0] == "NONE" or service["healthcheck"].get("disable"):
                problems.append(
                    f"service {name}: runs on (restart {restart}) without a healthcheck"
                )
        elif restart != "no":
            problems.append(f"service {name}: sets no restart policy (unless-stopped, or no)")
        elif name not in completed and not service.get("profiles"):
            problems.append(f"service {name}: a one-shot service nothing waits for")
    for name, service in stack.services.items():
        depends_on = service.get("depends_on") or {}
        if isinstance(depends_on, list):
            problems.append(f"service {name}: depends_on without conditions")
            continue
        for target, need in depends_on.items():
            wanted = (
                "service_healthy" if target in long_running else "service_completed_successfully"
            )
            if target not in stack.services:
                problems.append(f"service {name}: depends on {target}, which does not exist")
            elif need.get("condition") != wanted:
                condition = need.get("condition")
                problems.append(
                    f"service {name}: waits for {target} to be {condition}, not {wanted}"
                )
    return problems


def check_the_airflow_components_share_their_settings(stack: Stack) -> list[str]:
    components = {
        name: stack.environment(name)
        for name in stack.services
        if "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" in stack.environment(name)
    }
    problems = []
    for variable in (
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
        "AIRFLOW__CORE__FERNET_KEY",
        "AIRFLOW__API_AUTH__JWT_SECRET",
        "AIRFLOW__API__SECRET_KEY",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
        "AIRFLOW__CORE__EXECUTOR",
    ):
        values = {name: env.get(variable) for name, env in components.items()}
        if len(set(values.values())) != 1:
            problems.append(f"{variable} differs between the Airflow components: {sorted(values)}")
    api_servers = stack.services_running("api-server")
    for name, env in components.items():
        url = urlsplit(env.get("AIRFLOW__CORE__EXECUTION_API_SERVER_URL", ""))
        if url.hostname not in api_servers or url.path != "/execution/":
            problems.append(
                f"service {name}: the execution API at {url.geturl()} is not /execution/ on an "
                f"api-server service {api_servers}"
            )
            continue
        ports = [
            str(p).rsplit(":", 1)[-1].split("/")[0]
            for p in stack.services[url.hostname].get("ports", [])
        ]
        port = stack.environment(url.hostname).get("AIRFLOW__API__PORT", "8080")
        if str(url.port) != port or port not in ports:
            problems.append(
                f"service {name}: the execution API at {url.geturl()} is not on the api-server's "
                f"port {port}"
            )
    return problems


def check_interpolated_variables_and_secrets(stack: Stack) -> list[str]:
    used = {m.group("name") for m in VARIABLE.finditer(stack.text) if m.group("name")}
    problems = [
        f"${{{name}}} is not defined in .env.example" for name in sorted(used - set(stack.env))
    ]
    problems += [
        f".env.example defines {name}, which docker-compose.yaml never uses"
        for name in sorted(set(stack.env) - used)
    ]
    problems += [
        f".env.example: {name} must hold the {PLACEHOLDER} placeholder, not a real secret"
        for name, value in stack.env.items()
        if SECRET_NAME.search(name) and PLACEHOLDER not in value
    ]
    reference = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*(:?[-?][^}]*)?\}")
    for name, service in stack.services.items():
        raw = service.get("environment") or {}
        for variable, value in raw.items() if isinstance(raw, dict) else []:
            value = str(value)
            secrets = []
            if SECRET_NAME.search(variable):
                secrets.append(value)
            if value.startswith("{"):
                connection = json.loads(value)
                secrets.append(connection.get("password"))
                secrets.append(urlsplit(connection.get("extra", {}).get("url", "")).password)
            else:
                secrets.append(urlsplit(value).password)
            secrets = [secret for secret in secrets if secret]
            for secret in secrets:
                if not reference.fullmatch(secret):
                    problems.append(
                        f"service {name}: {variable} holds a secret written in the file; "
                        "take it from .env"
                    )
    gitignore = (REPO / ".gitignore").read_text().splitlines()
    if ".env" not in gitignore and "/.env" not in gitignore:
        problems.append(".gitignore does not ignore .env")
    if excluded_by_dockerignore(REPO, ".env") is None:
        problems.append(".dockerignore does not keep .env out of the build context")
    return problems


def memory_mib(size: str) -> float:
    units = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
    return float(size[:-1]) * units[size[-1].lower()]


def check_workers_fit_the_dag_profiles(stack: Stack) -> list[str]:
    problems = []
    if not stack.profiles:
        return ["no PhaseProfile found in dags/"]
    for name in stack.services_running("org.apache.spark.deploy.worker.Worker"):
        command = stack.command(name)
        cores, memory = int(option(command, "--cores") or 0), option(command, "--memory") or "0m"
        for profile, keywords in stack.profiles.items():
            wanted_cores = int(keywords.get("executor_cores", 1))
            wanted_memory = str(keywords.get("executor_memory", "1g"))
            if wanted_cores > cores or memory_mib(wanted_memory) > memory_mib(memory):
                problems.append(
                    f"service {name}: offers {cores} cores and {memory}, {profile} asks "
                    f"{wanted_cores} cores and {wanted_memory} per executor"
                )
    return problems


CHECKS: list[Callable[[Stack], list[str]]] = [
    check_images_are_pinned,
    check_airflow_image_matches_the_pins,
    check_spark_image_matches_the_pins,
    check_spark_master_and_workers_agree,
    check_the_scheduler_is_reachable_by_executors,
    check_kafka_agrees_with_the_dag_environment,
    check_the_dags_read_the_environment_the_stack_sets,
    check_the_databases_agree_with_postgres,
    check_the_data_volume_is_the_data_dir,
    check_host_paths_exist,
    check_dockerfiles_copy_existing_paths,
    check_the_images_hold_the_tools_their_services_run,
    check_long_running_services_are_healthchecked,
    check_the_airflow_components_share_their_settings,
    check_interpolated_variables_and_secrets,
    check_workers_fit_the_dag_profiles,
]


# --- docker-compose itself -------------------------------------------------------------------


def docker_compose(*args: str, env_file: Path = ENV_EXAMPLE) -> subprocess.CompletedProcess[str]:
    """``docker-compose`` on the stack, with .env.example's values and nothing from this
    environment; no daemon to reach, and `config` needs none."""
    executable = shutil.which("docker-compose")
    if executable is None:
        missing("docker-compose is not installed (scripts/install-test-tools installs it)")
    command = [executable, "--project-directory", str(REPO), "-f", str(COMPOSE_FILE)]
    return subprocess.run(
        [*command, "--env-file", str(env_file), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", "/tmp"),
            "DOCKER_HOST": "unix:///nonexistent/docker.sock",
        },
        timeout=120,
    )


def test_docker_compose_config_accepts_the_stack_as_interpolated_here(stack):
    result = docker_compose("config")
    assert result.returncode == 0, result.stderr
    normalized = yaml.safe_load(result.stdout)
    assert set(normalized["services"]) == set(stack.services)
    assert set(normalized["volumes"]) == set(stack.compose["volumes"])
    for name, service in normalized["services"].items():
        assert service.get("image") == stack.services[name].get("image"), name
        environment = {k: str(v) for k, v in (service.get("environment") or {}).items()}
        assert environment == stack.environment(name), name
        assert [str(c) for c in service.get("command") or []] == stack.command(name), name


def test_docker_compose_refuses_to_run_without_the_secrets(tmp_path):
    env_file = tmp_path / "empty.env"
    env_file.write_text("")
    result = docker_compose("config", env_file=env_file)
    assert result.returncode != 0
    assert "set it in .env, see .env.example" in result.stderr


# --- the stack agrees with the project -------------------------------------------------------


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_the_stack_passes(stack, check):
    problems = check(stack)
    assert not problems, "\n".join(problems)


def with_service(name: str, change: Callable[[dict], None]) -> Callable[[Stack], None]:
    return lambda stack: change(stack.services[name])


def set_env(name: str, variable: str, value: str) -> Callable[[Stack], None]:
    return with_service(name, lambda service: service["environment"].__setitem__(variable, value))


def replace_in_dockerfile(path: str, old: str, new: str) -> Callable[[Stack], None]:
    def change(stack: Stack) -> None:
        assert old in stack.dockerfiles[path]
        stack.dockerfiles[path] = stack.dockerfiles[path].replace(old, new)

    return change


def replace_command_word(name: str, old: str, new: str) -> Callable[[Stack], None]:
    return with_service(
        name,
        lambda service: service.__setitem__(
            "command", [new if w == old else w for w in service["command"]]
        ),
    )


BREAKAGES = [
    (
        "the Airflow image on another Airflow",
        replace_in_dockerfile("docker/airflow/Dockerfile", "airflow:3.3.2-", "airflow:3.2.2-"),
        check_airflow_image_matches_the_pins,
        "3.2.2-python3.11 is Airflow 3.2.2, constraints.txt pins apache-airflow==3.3.2",
    ),
    (
        "the Airflow image on another Python",
        replace_in_dockerfile("docker/airflow/Dockerfile", "-python3.11", "-python3.12"),
        check_airflow_image_matches_the_pins,
        "runs Python 3.12, the Spark image's executors run Python 3.11",
    ),
    (
        "the Spark image on another Spark",
        replace_in_dockerfile("docker/spark/Dockerfile", "spark:4.3.0-", "spark:4.2.0-"),
        check_spark_image_matches_the_pins,
        "is Spark 4.2.0, constraints.txt pins pyspark==4.3.0",
    ),
    (
        "an unpinned image",
        with_service("kafka", lambda s: s.__setitem__("image", "apache/kafka:latest")),
        check_images_are_pinned,
        "service kafka: image apache/kafka:latest is not pinned",
    ),
    (
        "an image without a tag in a Dockerfile",
        replace_in_dockerfile("docker/spark/Dockerfile", "uv:0.9.26", "uv"),
        check_images_are_pinned,
        "docker/spark/Dockerfile: image ghcr.io/astral-sh/uv is not pinned",
    ),
    (
        "the master on another port",
        replace_command_word("spark-master", "7077", "7078"),
        check_spark_master_and_workers_agree,
        "service spark-worker-1: registers with spark://spark-master:7077, not spark://spark-master:7078",
    ),
    (
        "the Spark connection on another port",
        set_env(
            "airflow-scheduler",
            "AIRFLOW_CONN_SPARK_DEFAULT",
            '{"conn_type": "spark", "host": "spark://spark-master", "port": 7070}',
        ),
        check_spark_master_and_workers_agree,
        "service airflow-scheduler: AIRFLOW_CONN_SPARK_DEFAULT gives master spark://spark-master:7070",
    ),
    (
        "the driver's host name unknown to the network",
        set_env("airflow-scheduler", "SPARK_LOCAL_HOSTNAME", "scheduler"),
        check_the_scheduler_is_reachable_by_executors,
        "service airflow-scheduler: SPARK_LOCAL_HOSTNAME scheduler and hostname airflow-scheduler",
    ),
    (
        "the DAG pointed at another Kafka port",
        set_env("airflow-scheduler", "BACKLOG_KAFKA_BOOTSTRAP_SERVERS", "kafka:29092"),
        check_kafka_agrees_with_the_dag_environment,
        "service airflow-scheduler: BACKLOG_KAFKA_BOOTSTRAP_SERVERS=kafka:29092, not kafka:9092",
    ),
    (
        "the topic created with other partitions",
        replace_command_word("kafka-init", "8", "4"),
        check_kafka_agrees_with_the_dag_environment,
        "service kafka-init: creates 4 partitions, not 8",
    ),
    (
        "the metrics URL on another database",
        set_env(
            "airflow-triggerer",
            "AIRFLOW_CONN_BACKLOG_METRICS_DEFAULT",
            '{"conn_type": "backlog_metrics", "password": "${METRICS_DB_PASSWORD}", '
            '"extra": {"url": "postgresql://metrics@postgres:5432/airflow"}}',
        ),
        check_the_databases_agree_with_postgres,
        "service airflow-triggerer: AIRFLOW_CONN_BACKLOG_METRICS_DEFAULT reaches",
    ),
    (
        "the metrics connection with Airflow's database password",
        set_env(
            "airflow-scheduler",
            "AIRFLOW_CONN_BACKLOG_METRICS_DEFAULT",
            '{"conn_type": "backlog_metrics", "password": "${AIRFLOW_DB_PASSWORD}", '
            '"extra": {"url": "postgresql://metrics@postgres:5432/metrics"}}',
        ),
        check_the_databases_agree_with_postgres,
        "service airflow-scheduler: AIRFLOW_CONN_BACKLOG_METRICS_DEFAULT has another password",
    ),
    (
        "a password in a connection's URL written in the file",
        set_env(
            "airflow-scheduler",
            "AIRFLOW_CONN_BACKLOG_METRICS_DEFAULT",
            '{"conn_type": "backlog_metrics", '
            '"extra": {"url": "postgresql://metrics:hunter2@postgres:5432/metrics"}}',
        ),
        check_interpolated_variables_and_secrets,
        "service airflow-scheduler: AIRFLOW_CONN_BACKLOG_METRICS_DEFAULT holds a secret",
    ),
    (
        "the data volume mounted elsewhere on a worker",
        with_service("spark-worker-2", lambda s: s.__setitem__("volumes", ["backlog-data:/data"])),
        check_the_data_volume_is_the_data_dir,
        "service spark-worker-2: does not mount the data volume at /var/lib/backlog",
    ),
    (
        "a bind mount of a missing file",
        with_service(
            "postgres", lambda s: s["volumes"].append("./docker/postgres/nope.sh:/x.sh:ro")
        ),
        check_host_paths_exist,
        "service postgres: bind mount ./docker/postgres/nope.sh (for /x.sh) is missing",
    ),
    (
        "a COPY of a missing path",
        replace_in_dockerfile(
            "docker/airflow/Dockerfile", "COPY docker/check_image.py", "COPY docker/check.py"
        ),
        check_dockerfiles_copy_existing_paths,
        "docker/airflow/Dockerfile: COPY docker/check.py, which the build context lacks",
    ),
    (
        "a COPY of a path .dockerignore leaves out",
        replace_in_dockerfile("docker/spark/Dockerfile", "COPY spark_jobs ", "COPY tests "),
        check_dockerfiles_copy_existing_paths,
        "docker/spark/Dockerfile: COPY tests, which .dockerignore (tests) leaves out",
    ),
    (
        "a tool run where the image does not copy it",
        replace_in_dockerfile(
            "docker/airflow/Dockerfile", "tools /opt/backlog/tools", "tools /opt/tools"
        ),
        check_the_images_hold_the_tools_their_services_run,
        "service sample-data: runs tools.data.sample_data, but docker/airflow/Dockerfile does not "
        "copy tools to /opt/backlog/tools",
    ),
    (
        "a tool run without a working directory",
        with_service("sample-data", lambda s: s.pop("working_dir")),
        check_the_images_hold_the_tools_their_services_run,
        "service sample-data: runs tools.data.sample_data with no working_dir",
    ),
    (
        "a long-running service without a healthcheck",
        with_service("spark-worker-1", lambda s: s.pop("healthcheck")),
        check_long_running_services_are_healthchecked,
        "service spark-worker-1: runs on (restart unless-stopped) without a healthcheck",
    ),
    (
        "waiting for a one-shot service to be healthy",
        with_service(
            "sample-data",
            lambda s: s["depends_on"]["kafka-init"].__setitem__("condition", "service_healthy"),
        ),
        check_long_running_services_are_healthchecked,
        "sample-data: waits for kafka-init to be service_healthy, not service_completed_",
    ),
    (
        "a component with another JWT secret",
        set_env("airflow-triggerer", "AIRFLOW__API_AUTH__JWT_SECRET", "other"),
        check_the_airflow_components_share_their_settings,
        "AIRFLOW__API_AUTH__JWT_SECRET differs between the Airflow components",
    ),
    (
        "a secret written in the file",
        set_env("postgres", "POSTGRES_PASSWORD", "hunter2"),
        check_interpolated_variables_and_secrets,
        "service postgres: POSTGRES_PASSWORD holds a secret written in the file",
    ),
    (
        "a password inside a URL written in the file",
        set_env(
            "airflow-apiserver",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
            "postgresql+psycopg2://airflow:hunter2@postgres:5432/airflow",
        ),
        check_interpolated_variables_and_secrets,
        "service airflow-apiserver: AIRFLOW__DATABASE__SQL_ALCHEMY_CONN holds a secret",
    ),
    (
        "a variable .env.example lacks",
        lambda stack: setattr(stack, "text", stack.text + "\n# ${UNDEFINED_SETTING}\n"),
        check_interpolated_variables_and_secrets,
        "${UNDEFINED_SETTING} is not defined in .env.example",
    ),
    (
        "workers too small for the backlog profile",
        replace_command_word("spark-worker-1", "2g", "1536m"),
        check_workers_fit_the_dag_profiles,
        "spark-worker-1: offers 2 cores and 1536m, backlog_phased.py:BACKLOG_PROFILE asks 2 cores",
    ),
]


@pytest.mark.parametrize(
    "change, check, problem", [b[1:] for b in BREAKAGES], ids=[b[0] for b in BREAKAGES]
)
def test_a_broken_stack_is_refused_by_name(stack, change, check, problem):
    broken = copy.deepcopy(stack)
    change(broken)
    assert any(problem in found for found in check(broken)), check(broken)
