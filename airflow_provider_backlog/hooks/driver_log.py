"""A driver's log in a file of bounded size: spark-submit's output rotated as it is written.

A detached streaming job runs for days and its driver logs all along, so its output cannot
go straight into a file. ``python -m airflow_provider_backlog.hooks.driver_log --max-bytes N
--backups K PATH -- COMMAND...`` starts COMMAND with its output in a pipe and writes it to
PATH, rotated by the standard library's ``RotatingFileHandler`` into PATH.1 ... PATH.K.
It leads the process group the launch gives the driver, so ending that group ends it too;
it ignores SIGTERM to record the driver's last words, and ends once every writer has
closed the pipe, with the command's exit status (or signal).

Also here: the names of those files, safe whatever a job or run is called. Nothing but the
standard library is imported, so that the rotator starts quickly.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import os
import re
import signal
import subprocess
import sys
from logging.handlers import RotatingFileHandler
from pathlib import Path

#: Defaults: a driver's log takes at most 600 MiB, in its file and five older ones.
MAX_BYTES = 100 * 1024 * 1024
BACKUPS = 5
#: Bytes of a file ``tail`` reads at most: a log can be a hundred MiB.
TAIL_BYTES = 256 * 1024
#: The longest piece of a line written as one record; longer lines are split.
_MAX_RECORD = 64 * 1024
#: What a safe file name keeps of a name; anything else becomes ``-``.
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_file_name(name: str, suffix: str = "") -> str:
    """A file name for ``name`` (a job name or run id: any printable text) that stays in its
    folder: its letters, digits, ``.``, ``_`` and ``-``, shortened, then a hash of the whole
    name, so that names differing only in what was replaced (``a/b``, ``a b``) do not
    share a file and ``..`` or ``/`` cannot lead out of the folder."""
    slug = _UNSAFE.sub("-", name).strip(".-")[:80]
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{slug}-{digest}{suffix}" if slug else f"{digest}{suffix}"


def log_files(path: Path) -> list[Path]:
    """The log's files, newest first: ``path`` and whichever of its rotated ``path.1``,
    ``path.2``... exist."""
    files = [path] if path.exists() else []
    number = 1
    while (rotated := path.with_name(f"{path.name}.{number}")).exists():
        files.append(rotated)
        number += 1
    return files


def tail(path: Path, lines: int) -> list[str]:
    """The log's last ``lines`` lines, from the rotated files too when the current one holds
    fewer, reading at most ``TAIL_BYTES`` of each file."""
    found: list[str] = []
    for file in log_files(path):
        try:
            with file.open("rb") as log:
                size = log.seek(0, os.SEEK_END)
                log.seek(max(size - TAIL_BYTES, 0))
                text = log.read().decode(errors="replace").splitlines()
        except FileNotFoundError:  # rotated away, or out, just now
            continue
        if size > TAIL_BYTES:
            text = text[1:]  # the first line is cut
        found = text + found
        if len(found) >= lines:
            break
    return found[-lines:] if lines > 0 else []


def main(argv: list[str] | None = None) -> int:
    """Run the command with its output rotated into the file; return its exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-bytes", type=int, required=True, help="rotate at this size")
    parser.add_argument("--backups", type=int, required=True, help="rotated files to keep")
    parser.add_argument("path", type=Path, help="the log file")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- and the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.max_bytes < 2 or args.backups < 1 or not command:
        parser.error("--max-bytes must be at least 2, --backups at least 1, and a command given")
    # Latin-1 maps every byte to one character and back: the file gets the output's bytes
    # exactly, and the handler's size check counts bytes.
    handler = RotatingFileHandler(
        args.path, maxBytes=args.max_bytes, backupCount=args.backups, encoding="latin-1"
    )
    handler.terminator = ""
    # A handler, not SIG_IGN: exec resets it, so the command still ends on SIGTERM.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        child = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
    except OSError as error:
        handler.emit(logging.makeLogRecord({"msg": f"cannot start {command[0]}: {error}\n"}))
        return 127
    assert child.stdout is not None
    # Half the limit at most, so that a record always fits in a fresh file.
    piece = max(1, min(_MAX_RECORD, args.max_bytes // 2))
    with child.stdout:
        while chunk := child.stdout.readline(piece):
            handler.emit(logging.makeLogRecord({"msg": chunk.decode("latin-1")}))
    handler.close()
    code = child.wait()
    if code < 0:  # end as the command did, so that the launch sees the signal
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


if __name__ == "__main__":
    sys.exit(main())
