"""A throwaway PostgreSQL server: its own cluster in a temp dir, on a free port.

The tests, the CDC demo and the benchmark each need a database they may fill, break and
delete without touching anyone's real one, and a fresh clone has only Debian's binaries, no
running server. It can be stopped and started again on the same data directory and port,
which is how tests make the database go away and come back. initdb and postgres refuse to
run as root, so as root every server command runs as the ``postgres`` OS user.

It trades durability for speed (fsync, full-page writes and synchronous commit off): a
crash may lose it, which no throwaway database minds. For the same reason a new server's
cluster is a copy of one made once per binaries, initdb options, OS user, database user and
database (``_template``): initdb and the single-user run that creates the database cost
about a CPU-second each time, and the suite starts some seventy servers.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import glob
import hashlib
import json
import os
import pwd
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO

from spark_jobs.storage import lock_files
from tools.services.ports import free_port

INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found in PATH or "
    "/usr/lib/postgresql/*/bin; install Debian's postgresql package "
    "(scripts/install-test-tools installs it)"
)
_TOOLS = ("initdb", "pg_ctl", "postgres")
#: How every cluster is made; part of its template's key, so a change makes new templates.
#: initdb syncs: a template outlives a crash of the machine, as its copies need not.
_INITDB_OPTIONS = ("--auth=trust", "--encoding=UTF8", "--locale=C")
#: Written into a template last, listing its files: one without it, or without the files it
#: lists (cleaned out of the temp dir by age, say), is made again instead of being copied
#: into every later server.
_COMPLETE = "backlog-template-complete"
#: How long a server waits for another process's build of its template: a build takes
#: seconds, so a lock held longer is a builder stopped or hung, which the error names.
_LOCK_WAIT_S = 300.0
#: Copies a server makes of a template that changed under them before it gives up.
_COPY_TRIES = 3
#: The environment every server command runs in: initdb writes the time zone it finds
#: into the template, which would otherwise be the first builder's.
_TOOL_ENVIRONMENT = {"LC_ALL": "C", "PGTZ": "UTC", "TZ": "UTC"}
#: Settings for a server whose changes can be read through logical replication slots.
LOGICAL_DECODING = {"wal_level": "logical", "max_replication_slots": "10", "max_wal_senders": "10"}


class PostgresUnavailable(RuntimeError):
    """This machine cannot run a throwaway server: the binaries or the OS user are missing.

    Its own type, so that tests can skip on it while a real failure of a server that could
    start still fails them.
    """


def _version_key(bin_dir: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", Path(bin_dir).parent.name))


def template_root() -> Path:
    """Where the cluster templates are kept: one directory per effective user, as a
    template one user made another may neither lock nor copy."""
    return Path(tempfile.gettempdir()) / f"backlog-postgres-templates-{os.geteuid()}"


def _own_directory(path: Path) -> Path:
    """``path``, made if missing, refused unless it is a directory of this user's that no one
    else may write: a template another user could plant or swap would run their settings
    (a ``restore_command``) as this user. Made enterable whatever the umask, as the
    ``postgres`` OS user builds in it when this user is root."""
    path.mkdir(mode=0o755, exist_ok=True)
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o022:
        raise PostgresUnavailable(
            f"{path} is not a directory of this user's alone (owner uid {found.st_uid}, mode "
            f"{stat.filemode(found.st_mode)}): remove it, or set TMPDIR to a directory of your own"
        )
    path.chmod(0o755)
    return path


def binaries_digest(bin_dir: Path) -> str:
    """What identifies a build of the server: the ``postgres`` binary's content (release
    builds from npm all carry one fixed modification time)."""
    with (bin_dir / "postgres").open("rb") as binary:
        return hashlib.file_digest(binary, "sha256").hexdigest()


def find_bin_dir() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres of one PostgreSQL version."""
    candidates: list[Path] = []
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    candidates.extend(Path(d) for d in debian)
    for candidate in candidates:
        if all((candidate / tool).is_file() for tool in _TOOLS):
            return candidate
    return None


class PostgresServer:
    """``with PostgresServer() as server: ... server.url ...``.

    Starting it raises ``PostgresUnavailable`` when PostgreSQL is not installed (or, as root,
    cannot be run as ``postgres``).

    ``stop()`` keeps the cluster so ``start()`` brings the same server back on the same port;
    ``close()`` (or leaving the ``with`` block) stops it and deletes everything.
    ``settings`` are server settings (``-c name=value``, such as ``LOGICAL_DECODING``) given
    after the server's own, so they may also override those (``synchronous_commit``).
    """

    def __init__(
        self,
        database: str = "metrics",
        user: str = "postgres",
        settings: Mapping[str, str] | None = None,
        bin_dir: Path | None = None,
    ):
        if "\n" in database or "\0" in database:
            # The database is made in single-user mode, where a newline ends a statement.
            raise ValueError(f"database name {database!r}: a line break or NUL is not allowed")
        self.database = database
        self.user = user
        self.settings = dict(settings or {})
        self.port = 0
        self.running = False
        self._base: Path | None = None
        self._bin = bin_dir
        self._prefix: list[str] = []

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"

    @property
    def log_path(self) -> Path:
        return self._run_dir / "postgres.log"

    @property
    def _data_dir(self) -> Path:
        assert self._base is not None, "server was never started"
        return self._base / "data"

    @property
    def _run_dir(self) -> Path:
        assert self._base is not None, "server was never started"
        return self._base / "run"

    def __enter__(self) -> PostgresServer:
        try:
            return self.start()
        except BaseException:
            # __exit__ is not called when __enter__ fails: do not leave a cluster behind.
            self.close()
            raise

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def start(self) -> PostgresServer:
        """Create the cluster and database on first use, then (re)start the server."""
        if self.running:
            return self
        first = self._base is None
        if first:
            self._create_cluster()
        self._pg_ctl(
            "start",
            "-w",
            "-t",
            "30",
            "-l",
            str(self.log_path),
            "-o",
            f"-k {self._run_dir} -p {self.port} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            # pg_ctl hands these to a shell.
            + "".join(f" -c {shlex.quote(f'{k}={v}')}" for k, v in self.settings.items()),
        )
        self.running = True
        return self

    def stop(self) -> None:
        """Shut the server down (sessions are cut), keeping its data for ``start()``."""
        if self.running:
            self._pg_ctl("stop", "-w", "-t", "30", "-m", "fast")
            self.running = False

    def close(self) -> None:
        """Stop the server and delete its cluster."""
        try:
            self.stop()
        finally:
            if self._base is not None:
                shutil.rmtree(self._base, ignore_errors=True)
                self._base = None

    def _create_cluster(self) -> None:
        bin_dir = self._bin or find_bin_dir()
        if bin_dir is None:
            raise PostgresUnavailable(INSTALL_HINT)
        if not all((bin_dir / tool).is_file() for tool in _TOOLS):
            raise PostgresUnavailable(f"{', '.join(_TOOLS)} are not all in {bin_dir}")
        owner = None
        if os.geteuid() == 0:
            if shutil.which("runuser") is None:
                raise PostgresUnavailable(
                    "running as root needs runuser to start PostgreSQL as 'postgres'"
                )
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable(
                    "running as root needs a 'postgres' OS user (Debian's postgresql package)"
                ) from None
            self._prefix = ["runuser", "-u", "postgres", "--"]
        self._bin = bin_dir
        base = Path(tempfile.mkdtemp(prefix="postgres-"))
        base.chmod(0o755)
        self._base = base
        for directory in (self._data_dir, self._run_dir):
            directory.mkdir(mode=0o700)
            if owner is not None:
                os.chown(directory, owner.pw_uid, owner.pw_gid)
        self.port = free_port()
        self._copy_template(owner is not None)

    def _copy_template(self, as_postgres: bool) -> None:
        """The data directory filled from the template, under its lock held shared. A copy
        counts once the lock file still bears its name and the copy holds what the marker
        lists: a lock file removed meanwhile (a temp-dir cleaner) let another server remove
        the template under the copy, and a cleaner may take the template's files while it
        is copied; either way the copy ends short or fails, and is made again (with the
        template, if that is what lost files). The tries share one deadline."""
        deadline = time.monotonic() + _LOCK_WAIT_S
        for _ in range(_COPY_TRIES):
            with self._template(as_postgres, deadline) as (template, lock_held):
                # -a keeps the postgres user's ownership and the data directory's 0700.
                command = ["cp", "-a", f"{template}/.", str(self._data_dir)]
                copy = subprocess.run(command, capture_output=True, text=True, check=False)
                if lock_held() and _complete(self._data_dir):
                    return
                if copy.returncode != 0 and lock_held() and _complete(template):
                    raise RuntimeError(f"{' '.join(command)} failed:\n{copy.stderr}")
            _empty(self._data_dir)
        raise RuntimeError(
            f"the template of {self._data_dir} or its lock file was removed during each of "
            f"{_COPY_TRIES} copies: something keeps removing files in {template_root()}"
        )

    @contextlib.contextmanager
    def _template(
        self, as_postgres: bool, deadline: float
    ) -> Iterator[tuple[Path, Callable[[], bool]]]:
        """A cluster holding the database, made once for these binaries, initdb options, user
        and database and kept in the temp dir for every later server to copy, with a check
        that its lock is still the one at its path. Copied under its lock held shared, so
        that servers copy side by side and none removes a template another copies; made
        under it held exclusively, so that servers started at once make it once."""
        assert self._bin is not None
        build = binaries_digest(self._bin)
        key = json.dumps([str(self._bin), build, _INITDB_OPTIONS, self.user, self.database])
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        root = _own_directory(template_root())
        template, lock_path = root / digest, root / f"{digest}.lock"
        dropped: Exception | None = None
        while True:
            with _locked(lock_path, fcntl.LOCK_SH, deadline) as lock:
                if _complete(template):
                    yield template, functools.partial(lock_files.names, lock_path, lock)
                    return
            with _locked(lock_path, fcntl.LOCK_EX, deadline) as lock:
                if not _complete(template):
                    lock_held = functools.partial(lock_files.names, lock_path, lock)
                    dropped = self._build_template(template, as_postgres, lock_held) or dropped
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{template} was made and removed again for {_LOCK_WAIT_S:g} s: something "
                    f"keeps removing files in {root}"
                ) from dropped

    def _build_template(
        self, template: Path, as_postgres: bool, lock_held: Callable[[], bool]
    ) -> Exception | None:
        """``template`` made afresh (renamed into place whole) with a marker listing its
        files, under its lock held exclusively: whatever was there, or a killed build left
        beside it, goes first. A build whose lock file was removed meanwhile is dropped, as
        another server may be building beside it, and may have removed its files: its
        error, if it had one, is returned."""
        shutil.rmtree(template, ignore_errors=True)
        for left in template.parent.glob(f"{template.name}-*"):
            shutil.rmtree(left, ignore_errors=True)
        making = Path(tempfile.mkdtemp(prefix=f"{template.name}-", dir=template.parent))
        try:
            if as_postgres:
                shutil.chown(making, "postgres", "postgres")
            self._init_cluster(making)
            owner = pwd.getpwnam("postgres") if as_postgres else None
            _write_marker(making / _COMPLETE, json.dumps(_contents(making)), owner)
            if lock_held():
                making.rename(template)
                _sync_directory(template.parent)
        except (OSError, RuntimeError) as error:
            if lock_held():
                raise
            return error
        finally:
            shutil.rmtree(making, ignore_errors=True)
        return None

    def _init_cluster(self, data_dir: Path) -> None:
        self._run("initdb", "-D", str(data_dir), "-U", self.user, *_INITDB_OPTIONS)
        # The server binary alone creates it (single-user mode), where no client tool is.
        # That mode exits 0 after an error.
        name = self.database.replace('"', '""')
        output = self._run(
            "postgres", "--single", "-D", str(data_dir), "postgres",
            stdin=f'CREATE DATABASE "{name}"\n',
        )  # fmt: skip
        if "ERROR:" in output:
            raise RuntimeError(f"creating database {self.database!r} failed:\n{output}")

    def _pg_ctl(self, *args: str) -> None:
        self._run("pg_ctl", "-D", str(self._data_dir), *args)

    def _run(self, tool: str, *args: str, stdin: str | None = None) -> str:
        """``tool``'s output (stdout and stderr); RuntimeError if it fails."""
        assert self._bin is not None and self._base is not None
        command = [*self._prefix, str(self._bin / tool), *args]
        result = subprocess.run(
            command,
            cwd=self._base,
            env={**os.environ, **_TOOL_ENVIRONMENT},
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if result.returncode != 0:
            server_log = ""
            if self.log_path.exists():
                server_log = "\n--- server log ---\n" + self.log_path.read_text()[-4000:]
            raise RuntimeError(
                f"{' '.join(command)} exited with {result.returncode}:\n"
                f"{result.stdout}{result.stderr}{server_log}"
            )
        return result.stdout + result.stderr


@contextlib.contextmanager
def _locked(path: Path, mode: int, deadline: float) -> Iterator[IO[str]]:
    """The lock file at ``path`` locked in ``mode``, waiting until ``deadline`` at most."""
    lock = lock_files.acquire(path, mode, max(0.0, deadline - time.monotonic()))
    if lock is None:
        raise RuntimeError(
            f"{path} could not be locked for {_LOCK_WAIT_S:g} s: another process holds it "
            "while it builds or copies this template (end that process: lslocks names it, and "
            "every server waiting for it has the file open too), or something keeps removing it"
        )
    with lock:
        yield lock


def _contents(cluster: Path) -> dict[str, int]:
    """How many files and directories ``cluster`` holds and the files' bytes, its marker
    left out: a cleaner may take empty directories (``pg_notify``) a server cannot start
    without, as well as files."""
    files = directories = size = 0
    for directory, subdirectories, names in os.walk(cluster):
        directories += len(subdirectories)
        for name in names:
            path = os.path.join(directory, name)
            if path != os.path.join(cluster, _COMPLETE):
                files += 1
                size += os.lstat(path).st_size
    return {"files": files, "directories": directories, "bytes": size}


def _complete(cluster: Path) -> bool:
    """Whether ``cluster`` holds what its marker lists: a cleaner may have taken either."""
    try:
        listed = json.loads((cluster / _COMPLETE).read_text())
    except (OSError, ValueError):
        return False
    return listed == _contents(cluster)


def _empty(directory: Path) -> None:
    """Remove what ``directory`` holds, keeping it (its owner and mode are the server's)."""
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _write_marker(path: Path, content: str, owner: pwd.struct_passwd | None) -> None:
    """Made new, never through a link: as root the build directory is the postgres user's,
    who could have planted one there to have root write and hand over another file."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    with open(os.open(path, flags, 0o644), "w") as out:
        out.write(content)
        out.flush()
        os.fsync(out.fileno())
        if owner is not None:
            os.fchown(out.fileno(), owner.pw_uid, owner.pw_gid)


def _sync_directory(path: Path) -> None:
    """Make a rename in ``path`` outlive a crash."""
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
