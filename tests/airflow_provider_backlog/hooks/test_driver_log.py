import os
import sys
import time

import psutil

from airflow_provider_backlog.hooks import driver_log
from airflow_provider_backlog.hooks.submit import DriverProcess


def gone(processes: list[psutil.Process]) -> bool:
    return not [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a_log_rotates_at_its_size_keeps_its_backups_and_leaves_nothing_once_ended(tmp_path):
    """A real process writing 100 KB into a log rotated at 4 KiB with 3 backups."""
    log = tmp_path / "logs" / "run.log"
    writer = (
        "import time\n"
        "for i in range(2000):\n"
        "    print(f'line {i:05d}', 'x' * 40, flush=True)\n"
        "time.sleep(300)\n"
    )
    driver = DriverProcess.start(
        [sys.executable, "-c", writer], log, env=os.environ, max_bytes=4096, backups=3
    )
    deadline = time.monotonic() + 30
    while not driver.log_tail(1).startswith("line 01999") and time.monotonic() < deadline:
        time.sleep(0.1)
    files = driver_log.log_files(log)
    assert [file.name for file in files] == ["run.log", "run.log.1", "run.log.2", "run.log.3"]
    assert all(0 < file.stat().st_size <= 4096 for file in files)
    lines = "".join(file.read_text() for file in reversed(files)).splitlines()
    numbers = [int(line.split()[1]) for line in lines]
    assert numbers == list(range(numbers[0], 2000)), "the files hold the output in order"
    assert driver.log_tail(2) == f"line 01998 {'x' * 40}\nline 01999 {'x' * 40}"

    tree = driver.tree()
    assert len(tree) == 2, "the rotator leads the group, the writer is its child"
    driver.end(timeout_s=2.0)
    assert driver.exit_code == -15, "the rotator ends as the writer did"
    assert gone(tree)


def test_following_a_log_goes_on_across_a_rotation_and_ends_with_the_exit_code(tmp_path):
    log = tmp_path / "run.log"
    writer = (
        "import sys, time\n"
        "for i in range(60):\n"
        "    print(f'line {i:02d}', 'y' * 90, flush=True)\n"
        "    time.sleep(0.04)\n"
        "sys.exit(3)\n"
    )
    driver = DriverProcess.start(
        [sys.executable, "-c", writer], log, env=os.environ, max_bytes=3000, backups=2
    )
    assert list(driver.follow()) == [f"line {i:02d} {'y' * 90}" for i in range(60)]
    assert driver.exit_code == 3
    assert (tmp_path / "run.log.1").exists()


def test_the_tail_reaches_into_the_file_before_the_last_rotation(tmp_path):
    log = tmp_path / "run.log"
    (tmp_path / "run.log.2").write_text("a\nb\n")
    (tmp_path / "run.log.1").write_text("c\nd\ne\n")
    log.write_text("f\n")
    assert driver_log.tail(log, 3) == ["d", "e", "f"]
    assert driver_log.tail(log, 10) == ["a", "b", "c", "d", "e", "f"]
    assert driver_log.tail(tmp_path / "missing.log", 3) == []


def test_a_command_that_cannot_start_is_named_in_the_log(tmp_path):
    log = tmp_path / "run.log"
    driver = DriverProcess.start(["/nonexistent/spark-submit"], log, env=os.environ)
    assert driver.wait(30) == 127
    assert driver.log_tail() == (
        "cannot start /nonexistent/spark-submit: [Errno 2] No such file or directory: "
        "'/nonexistent/spark-submit'"
    )


def test_file_names_from_any_job_name_or_run_id_stay_in_their_folder_and_differ(tmp_path):
    names = [
        "../My Job/ü",
        "../My Job/u",
        "../My Job/ö",
        "..",
        "/",
        "",
        "events",
        "Events",
        "launch.1.ab12cd34",
        "ü" * 200,
        "a b/c\\d:e*f?g",
    ]
    files = [driver_log.safe_file_name(name, ".log") for name in names]
    assert len(set(files)) == len(names)
    for file in files:
        assert len(file.encode()) <= 100
        assert (tmp_path / file).resolve().parent == tmp_path.resolve()
        assert not file.startswith(".")
        assert all(c.isascii() and (c.isalnum() or c in "._-") for c in file)
    assert files[0].startswith("My-Job-") and files[0].endswith(".log")
    assert files[8].startswith("launch.1.ab12cd34-"), "a safe name is kept readable"
    assert driver_log.safe_file_name("events") == driver_log.safe_file_name("events")
