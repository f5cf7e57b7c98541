import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import text

from spark_jobs.metrics.schema import make_engine
from tests.support import postgres as test_postgres
from tests.support.postgres import PostgresServer
from tests.support.prerequisites import missing
from tools.services import postgres


def test_missing_binaries_say_which_package_installs_them(monkeypatch):
    monkeypatch.setattr(postgres, "find_bin_dir", lambda: None)
    with pytest.raises(postgres.PostgresUnavailable, match=r"Debian's postgresql package"):
        postgres.PostgresServer().start()


def test_a_test_server_skips_or_fails_by_ci_when_the_binaries_are_missing(monkeypatch):
    monkeypatch.setattr(postgres, "find_bin_dir", lambda: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"needed to run these tests"):
        test_postgres.PostgresServer().start()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"CI=true"):
        test_postgres.PostgresServer().start()


def test_a_server_stops_and_comes_back_on_its_port():
    with test_postgres.PostgresServer(database="probe") as server:
        port, url = server.port, server.url
        server.stop()
        assert not server.running
        server.start()
        assert (server.port, server.url) == (port, url)
        assert url == f"postgresql://postgres@127.0.0.1:{port}/probe"
        assert server.log_path.exists()


def test_a_database_name_is_taken_as_written_and_one_with_a_line_break_refused():
    with pytest.raises(ValueError, match=r"database name 'a\\nb': a line break or NUL"):
        PostgresServer(database="a\nb")
    with PostgresServer(database='my "shop"; x\\') as server:
        engine = make_engine(server.url.rsplit("/", 1)[0] + "/" + quote('my "shop"; x\\'))
        try:
            with engine.connect() as connection:
                assert connection.execute(text("SELECT current_database()")).scalar() == (
                    'my "shop"; x\\'
                )
        finally:
            engine.dispose()


def test_servers_copied_from_one_template_share_no_data():
    with PostgresServer(database="copied") as first, PostgresServer(database="copied") as second:
        engines = [make_engine(first.url), make_engine(second.url)]
        try:
            with engines[0].begin() as connection:
                connection.execute(text("CREATE TABLE only_here (id int)"))
            with engines[1].connect() as connection:
                found = connection.execute(text("SELECT to_regclass('only_here')")).scalar()
            assert found is None
        finally:
            for engine in engines:
                engine.dispose()


@pytest.fixture
def own_tmpdir(monkeypatch):
    """A temp dir of the test's own as TMPDIR, which the postgres user can enter (pytest's
    tmp_path is its owner's alone)."""
    path = Path(tempfile.mkdtemp(prefix="templates-"))
    path.chmod(0o755)
    monkeypatch.setenv("TMPDIR", str(path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_template_build_killed_midway_is_swept_and_made_again(own_tmpdir, monkeypatch):
    """A build killed before its rename leaves its half-made cluster; the next server of
    that kind removes it under the lock, makes the template whole and starts."""
    if test_postgres.find_bin_dir() is None:
        missing(postgres.INSTALL_HINT)
    root = postgres.template_root()
    builder = subprocess.Popen(
        [sys.executable, "-c", "from tools.services.postgres import PostgresServer as P\n"
         "P(database='killed').start()"],
        cwd=Path(__file__).resolve().parents[3],
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        # Killed once initdb has written some of the cluster, not before it began.
        while not (building := [p for p in root.glob("*-*") if p.is_dir() and any(p.iterdir())]):
            assert builder.poll() is None and time.monotonic() < deadline, "no build seen"
            time.sleep(0.005)
    finally:
        os.killpg(builder.pid, signal.SIGKILL)
        builder.wait()
    [left] = building
    assert left.exists()
    with PostgresServer(database="killed") as server:
        engine = make_engine(server.url)
        try:
            with engine.connect() as connection:
                assert connection.execute(text("SELECT current_database()")).scalar() == "killed"
        finally:
            engine.dispose()
    assert not left.exists()
    assert [p.name for p in root.iterdir() if p.is_dir()] == [left.name.split("-")[0]]


def test_changed_initdb_options_make_a_template_of_their_own(own_tmpdir, monkeypatch):
    assert show("options", "data_checksums") == "off"
    monkeypatch.setattr(postgres, "_INITDB_OPTIONS", (*postgres._INITDB_OPTIONS, "-k"))
    assert show("options", "data_checksums") == "on"
    assert len([p for p in postgres.template_root().iterdir() if p.is_dir()]) == 2


def test_a_template_directory_another_may_write_is_refused_and_a_strict_umask_is_fine(
    own_tmpdir,
):
    """Another user's (or a world-writable) directory could hold a planted template, whose
    settings would run as this user; a strict umask made the directory one the postgres
    OS user could not enter, and every start failed."""
    root = postgres.template_root()
    root.mkdir()
    root.chmod(0o777)
    with pytest.raises(postgres.PostgresUnavailable, match=r"is not a directory of this user"):
        postgres.PostgresServer(database="planted").start()
    root.rmdir()
    previous = os.umask(0o077)
    try:
        with PostgresServer(database="strict") as server:
            assert server.running
    finally:
        os.umask(previous)


def show(database: str, setting: str) -> str:
    """``SHOW setting`` on a new server of ``database``."""
    with PostgresServer(database=database) as server:
        engine = make_engine(server.url)
        try:
            with engine.connect() as connection:
                return connection.execute(text(f"SHOW {setting}")).scalar()
        finally:
            engine.dispose()


def test_a_template_whose_files_were_cleaned_out_is_made_again(own_tmpdir):
    """A temp-dir cleaner removes files by age and may leave the directories: a template
    without its files made every later server fail to start, for good."""
    assert show("cleaned", "server_encoding") == "UTF8"
    [template] = [p for p in postgres.template_root().iterdir() if p.is_dir()]
    for directory, _, files in os.walk(template):
        for name in files:
            os.unlink(os.path.join(directory, name))
    assert show("cleaned", "server_encoding") == "UTF8"
    assert (template / "PG_VERSION").is_file()


def test_the_builder_s_time_zone_does_not_become_every_server_s(own_tmpdir, monkeypatch):
    """initdb writes the time zone it finds into the cluster: servers copied from a template
    a user with another TZ made would run in that user's zone."""
    monkeypatch.setenv("TZ", "America/New_York")
    assert show("zoned", "TimeZone") == "UTC"


def test_a_rebuilt_server_binary_of_the_same_size_and_time_is_another_build(tmp_path):
    binary = tmp_path / "postgres"
    digests = []
    fixed = 499_137_600 * 10**9  # one time for every build, as the npm releases carry
    for content in (b"a" * 4096, b"b" * 4096):
        binary.write_bytes(content)
        os.utime(binary, ns=(fixed, fixed))
        digests.append(postgres.binaries_digest(tmp_path))
    assert digests[0] != digests[1]


def test_a_template_lock_held_too_long_is_an_error_naming_it(own_tmpdir, monkeypatch):
    """A builder stopped while it holds the lock kept every later server waiting forever."""
    assert show("held", "server_encoding") == "UTF8"
    [path] = postgres.template_root().glob("*.lock")
    monkeypatch.setattr(postgres, "_LOCK_WAIT_S", 0.5)
    waiting = PostgresServer(database="held")
    with path.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(
            RuntimeError, match=rf"{path} could not be locked for 0.5 s: another process holds it"
        ):
            waiting.start()
    waiting.close()
    assert show("held", "server_encoding") == "UTF8"


def test_servers_copy_one_template_side_by_side_under_its_lock_held_shared(own_tmpdir, monkeypatch):
    """A server finding the template incomplete (a temp-dir cleaner took its marker) removed
    it while another server was copying it. Copies share the lock: two run at once (each
    copy waits here for the other to begin), and no server may take it to remove one."""
    assert show("copied", "server_encoding") == "UTF8"
    [path] = postgres.template_root().glob("*.lock")
    both_copying = threading.Barrier(2, timeout=30)
    exclusive = []
    run = subprocess.run

    def copying(command, *args, **kwargs):
        if command[0] == "cp":
            both_copying.wait()
            with path.open("a") as other:
                try:
                    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    exclusive.append("taken")
                except BlockingIOError:
                    exclusive.append("refused")
        return run(command, *args, **kwargs)

    monkeypatch.setattr(postgres.subprocess, "run", copying)
    servers = [PostgresServer(database="copied") for _ in range(2)]
    with ThreadPoolExecutor(2) as pool:
        started = list(pool.map(lambda server: server.start(), servers))
    for server in started:
        server.close()
    assert exclusive == ["refused", "refused"]


def test_a_copy_made_while_the_lock_file_was_removed_is_made_again(own_tmpdir, monkeypatch):
    """The lock file was never written, so a cleaner removing files by age took it first;
    the next server then made a lock of its own and removed the template under a copy,
    which can end short without an error. Here that copy loses its database's files: the
    server copies again, and its database holds its catalog."""
    assert show("unlinked", "server_encoding") == "UTF8"
    root = postgres.template_root()
    [lock] = root.glob("*.lock")
    run = subprocess.run
    copies = []

    def copying(command, *args, **kwargs):
        result = run(command, *args, **kwargs)
        if command[0] == "cp":
            copies.append(command[-1])
            if len(copies) == 1:  # the cleaner, then another server, during this copy
                lock.unlink()
                (root / lock.stem / postgres._COMPLETE).unlink()
                for table in (Path(command[-1]) / "base").glob("*/*"):
                    table.unlink()
                PostgresServer(database="unlinked").start().close()
        return result

    monkeypatch.setattr(postgres.subprocess, "run", copying)
    with PostgresServer(database="unlinked") as server:
        engine = make_engine(server.url)
        try:
            with engine.connect() as connection:
                assert connection.execute(text("SELECT count(*) FROM pg_class")).scalar() > 100
        finally:
            engine.dispose()
    assert len(copies) == 3 and copies[0] == copies[2], copies
    assert lock.is_file()


def test_a_copy_that_fails_because_the_template_went_with_its_lock_is_made_again(
    own_tmpdir, monkeypatch
):
    """cp exits 1 when the template is gone before it starts (a cleaner took the lock file,
    another server the template): that raised at once, though the next try would work."""
    assert show("vanished", "server_encoding") == "UTF8"
    root = postgres.template_root()
    [lock] = root.glob("*.lock")
    run = subprocess.run
    copies = []

    def copying(command, *args, **kwargs):
        if command[0] == "cp":
            if not copies:
                lock.unlink()
                shutil.rmtree(root / lock.stem)
            copies.append(run(command, *args, **kwargs).returncode)
            return subprocess.CompletedProcess(command, copies[-1], "", "")
        return run(command, *args, **kwargs)

    monkeypatch.setattr(postgres.subprocess, "run", copying)
    assert_has_catalog("vanished")
    assert copies == [1, 0]


def test_a_template_a_cleaner_took_files_from_but_not_its_marker_is_made_again(own_tmpdir):
    """A cleaner by age may take the tables and leave the marker: every later copy lacked
    its catalog and passed, because only the marker was checked."""
    assert show("aged", "server_encoding") == "UTF8"
    [template] = [p for p in postgres.template_root().iterdir() if p.is_dir()]
    for table in list((template / "base").glob("*/*"))[::3]:
        table.unlink()
    assert_has_catalog("aged")
    assert postgres._complete(template)


def test_files_a_cleaner_takes_from_the_template_during_a_copy_make_it_again(
    own_tmpdir, monkeypatch
):
    assert show("mid", "server_encoding") == "UTF8"
    [template] = [p for p in postgres.template_root().iterdir() if p.is_dir()]
    run = subprocess.run
    copies = []

    def copying(command, *args, **kwargs):
        if command[0] == "cp":
            copies.append(command[-1])
            if len(copies) == 1:
                (template / "PG_VERSION").unlink()
        return run(command, *args, **kwargs)

    monkeypatch.setattr(postgres.subprocess, "run", copying)
    assert_has_catalog("mid")
    assert len(copies) == 2 and postgres._complete(template)


def test_a_build_whose_lock_file_was_removed_gives_way_to_the_server_building_beside_it(
    own_tmpdir, monkeypatch
):
    """The builder never looked at its lock again: with its lock file gone, a second server
    took a new lock and swept the first one's build directory as a killed build's, and the
    first failed on a directory removed under it."""
    root = postgres.template_root()
    init = postgres.PostgresServer._init_cluster
    builds = []

    def building(server, data_dir):
        builds.append(data_dir)
        init(server, data_dir)
        if len(builds) == 1:  # a cleaner, then another server, during the first build
            [lock] = root.glob("*.lock")
            lock.unlink()
            postgres.PostgresServer(database="beside").start().close()

    monkeypatch.setattr(postgres.PostgresServer, "_init_cluster", building)
    assert_has_catalog("beside")
    assert len(builds) == 2 and not builds[0].exists()
    assert [p.name for p in root.iterdir() if p.is_dir()] == [builds[1].name.split("-")[0]]


def test_a_template_removed_after_every_build_is_an_error_in_bounded_time(own_tmpdir, monkeypatch):
    monkeypatch.setattr(postgres, "_LOCK_WAIT_S", 1.0)
    monkeypatch.setattr(postgres.PostgresServer, "_build_template", lambda *_: time.sleep(0.1))
    server = postgres.PostgresServer(database="never")
    with pytest.raises(RuntimeError, match=r"was made and removed again for 1 s: something keeps"):
        server.start()
    server.close()


def assert_has_catalog(database: str) -> None:
    with PostgresServer(database=database) as server:
        engine = make_engine(server.url)
        try:
            with engine.connect() as connection:
                assert connection.execute(text("SELECT count(*) FROM pg_class")).scalar() > 100
        finally:
            engine.dispose()


def test_a_template_a_cleaner_took_empty_directories_from_is_made_again(own_tmpdir):
    """A cleaner removing empty directories left the files' count and bytes as they were,
    and every later server failed on a missing pg_notify."""
    assert show("emptied", "server_encoding") == "UTF8"
    [template] = [p for p in postgres.template_root().iterdir() if p.is_dir()]
    for directory, _, _ in os.walk(template, topdown=False):
        if directory != str(template) and not os.listdir(directory):
            os.rmdir(directory)
    assert not postgres._complete(template)
    assert_has_catalog("emptied")


def test_a_copy_cp_fails_on_because_a_cleaner_took_a_file_of_the_template_is_made_again(
    own_tmpdir, monkeypatch
):
    """cp exits 1 on a file removed while it runs, the lock untouched: that raised at once."""
    assert show("failing", "server_encoding") == "UTF8"
    [template] = [p for p in postgres.template_root().iterdir() if p.is_dir()]
    run = subprocess.run
    copies = []

    def copying(command, *args, **kwargs):
        if command[0] != "cp":
            return run(command, *args, **kwargs)
        if not copies:  # the cleaner takes PG_VERSION after cp listed it
            (template / "PG_VERSION").unlink()
            command = [*command[:-1], str(template / "PG_VERSION"), command[-1]]
        copies.append(run(command, *args, **kwargs).returncode)
        return subprocess.CompletedProcess(command, copies[-1], "", "")

    monkeypatch.setattr(postgres.subprocess, "run", copying)
    assert_has_catalog("failing")
    assert copies == [1, 0]


def test_the_copies_of_one_start_share_one_lock_deadline(own_tmpdir, monkeypatch):
    """Each copy started its own wait: three tries could wait three times as long."""
    assert show("bounded", "server_encoding") == "UTF8"
    [lock] = postgres.template_root().glob("*.lock")
    monkeypatch.setattr(postgres, "_LOCK_WAIT_S", 1.0)
    acquire, run = postgres.lock_files.acquire, subprocess.run
    waited: list[float] = []

    def slow(path, mode, wait_s):  # another process holding the lock for 0.4 s each time
        waited.append(min(0.4, wait_s))
        time.sleep(waited[-1])
        return acquire(path, mode, wait_s)

    def copying(command, *args, **kwargs):
        result = run(command, *args, **kwargs)
        if command[0] == "cp":
            lock.unlink(missing_ok=True)  # a cleaner, during every copy
        return result

    monkeypatch.setattr(postgres.lock_files, "acquire", slow)
    monkeypatch.setattr(postgres.subprocess, "run", copying)
    server = postgres.PostgresServer(database="bounded")
    with pytest.raises(RuntimeError):
        server.start()
    server.close()
    assert sum(waited) <= 1.0, waited


@pytest.mark.skipif(os.geteuid() != 0, reason="the build directory is another user's as root")
def test_as_root_a_link_the_postgres_user_plants_for_the_marker_is_never_followed(
    own_tmpdir, monkeypatch, tmp_path
):
    """Root wrote the marker through a link in the postgres user's build directory, and
    chowned what it pointed to: any file of root's, rewritten and handed to postgres."""
    victim = tmp_path / "root's file"
    victim.write_text("root's\n")
    init = postgres.PostgresServer._init_cluster

    def init_then_plant(server, data_dir):
        init(server, data_dir)
        link = ["ln", "-s", str(victim), str(data_dir / postgres._COMPLETE)]
        subprocess.run(["runuser", "-u", "postgres", "--", *link], check=True)

    monkeypatch.setattr(postgres.PostgresServer, "_init_cluster", init_then_plant)
    server = postgres.PostgresServer(database="planted")
    with pytest.raises(FileExistsError):
        server.start()
    server.close()
    assert (victim.read_text(), victim.stat().st_uid) == ("root's\n", 0)
