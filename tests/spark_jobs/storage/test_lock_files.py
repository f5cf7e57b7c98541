import fcntl
import os
import threading
import time

from spark_jobs.storage import lock_files


def test_a_lock_removed_while_a_process_waits_for_it_is_taken_afresh(tmp_path):
    path = tmp_path / "x.lock"
    held = lock_files.acquire(path, fcntl.LOCK_EX, 0)
    assert held is not None
    taken: list = []
    waiter = threading.Thread(
        target=lambda: taken.append(lock_files.acquire(path, fcntl.LOCK_EX, 10))
    )
    waiter.start()
    time.sleep(0.2)
    path.unlink()  # as a cleaner does while the lock is held
    assert not lock_files.names(path, held)
    held.close()
    waiter.join(10)
    (lock,) = taken
    assert lock is not None and lock_files.names(path, lock)
    assert lock_files.acquire(path, fcntl.LOCK_EX, 0) is None, "two processes would hold it"
    lock.close()


def test_shared_holders_side_by_side_keep_an_exclusive_one_out_until_its_wait_ends(tmp_path):
    path = tmp_path / "x.lock"
    first = lock_files.acquire(path, fcntl.LOCK_SH, 0)
    second = lock_files.acquire(path, fcntl.LOCK_SH, 0)
    assert first is not None and second is not None
    began = time.monotonic()
    assert lock_files.acquire(path, fcntl.LOCK_EX, 0.3) is None
    assert time.monotonic() - began >= 0.3
    first.close()
    second.close()
    exclusive = lock_files.acquire(path, fcntl.LOCK_EX, 0)
    assert exclusive is not None
    exclusive.close()


def test_a_lock_taken_is_touched_so_that_a_cleaner_by_age_keeps_it(tmp_path):
    path = tmp_path / "x.lock"
    path.touch()
    os.utime(path, (0, 0))
    lock = lock_files.acquire(path, fcntl.LOCK_SH, 0)
    assert lock is not None
    assert time.time() - os.stat(path).st_mtime < 60
    lock.close()


def test_a_lock_path_that_is_a_symbolic_link_is_never_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("someone's file")
    (tmp_path / "x.lock").symlink_to(target)
    try:
        lock_files.acquire(tmp_path / "x.lock", fcntl.LOCK_EX, 0)
    except OSError as error:
        assert error.errno == 40  # ELOOP
    else:
        raise AssertionError("a symlinked lock path was opened")
    assert target.read_text() == "someone's file"


def test_a_fifo_at_the_lock_path_is_an_error_at_once_instead_of_an_open_that_never_returns(
    tmp_path,
):
    """A FIFO without a reader held the open forever, whatever the wait."""
    path = tmp_path / "x.lock"
    os.mkfifo(path)
    raised: list[BaseException] = []

    def take() -> None:
        try:
            lock_files.acquire(path, fcntl.LOCK_EX, 0)
        except OSError as error:
            raised.append(error)

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    taker.join(5)
    assert not taker.is_alive(), "acquire still blocked after 5 s"
    assert raised, "a FIFO served as a lock file"
