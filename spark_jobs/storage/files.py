"""Durable storage shared by the sources and the driver: locations as URIs, and state files
that are created once and never overwritten.

A position in Spark's offset log names rows through state kept beside the checkpoint (a
manifest of admitted files, the resolved starting offsets, the metrics journal). Two
drivers on one checkpoint must never both write that state: the lease keeps a second one
out, and if it ever got in, creating a state file that exists fails instead of replacing
what the first one wrote. On local disks creation is atomic and exclusive (a hard link of a
fully written, synced temporary file); on HDFS a rename onto an existing file fails the
same way; object stores (S3) offer no exclusive creation, so there the lease alone guards.

Everything here works with local paths and any URI ``pyarrow.fs`` understands.
"""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from pyarrow import fs as pa_fs

#: Spark's and Hadoop's convention: names starting with these are in progress or metadata.
HIDDEN_PREFIXES = (".", "_")
#: Hadoop's names for S3, which pyarrow calls ``s3``.
SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3"}


class StorageError(RuntimeError):
    """A location that cannot be read or written as the state requires; the message names it."""


class StateFileExists(StorageError):
    """A state file that is created once already exists: another writer got there first."""


def resolve_uri(location: str) -> str:
    """An absolute URI for a path or URI, so executors in other processes find the same file.

    Hadoop's ``file:/path`` spelling (what Spark reports) is taken as the local path.
    """
    if "://" in location:
        scheme, rest = location.split("://", 1)
        return f"{SCHEME_ALIASES.get(scheme, scheme)}://{rest}".rstrip("/")
    if location.startswith("file:"):
        location = location.removeprefix("file:")
    return Path(os.path.abspath(location)).as_uri()


def normalize_location(location: str) -> str:
    """One spelling per place: ``/data/ck/``, ``file:/data/ck`` and ``/data/x/../ck`` are the
    same checkpoint, and so is a symbolic link to it. Used as the lease's key."""
    uri = resolve_uri(location)
    parts = urlsplit(uri)
    if parts.scheme == "file":
        _, path = filesystem(uri)
        return Path(os.path.realpath(path)).as_uri()
    path = posixpath.normpath(parts.path or "/")
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path.rstrip("/") or "/", "", ""))


def filesystem(uri: str) -> tuple[pa_fs.FileSystem, str]:
    return pa_fs.FileSystem.from_uri(uri)


@dataclass(frozen=True)
class ListedFile:
    uri: str
    size: int
    mtime_ns: int


def list_files(directory_uri: str, glob: str) -> list[ListedFile]:
    """Visible files directly in ``directory_uri`` whose names match ``glob``."""
    fs, path = filesystem(directory_uri)
    try:
        infos = fs.get_file_info(pa_fs.FileSelector(path, allow_not_found=False))
    except FileNotFoundError as error:
        raise StorageError(f"input directory {directory_uri} does not exist") from error
    listed = []
    for info in infos:
        name = info.base_name
        if info.type != pa_fs.FileType.File or name.startswith(HIDDEN_PREFIXES):
            continue
        if fnmatch.fnmatch(name, glob):
            uri = f"{directory_uri}/{quote(name)}"
            listed.append(ListedFile(uri, info.size, info.mtime_ns or 0))
    return listed


def stat_file(uri: str) -> ListedFile:
    fs, path = filesystem(uri)
    info = fs.get_file_info(path)
    if info.type != pa_fs.FileType.File:
        raise StorageError(f"input file {uri} was listed or admitted but is gone")
    return ListedFile(uri, info.size, info.mtime_ns or 0)


def create_file(fs: pa_fs.FileSystem, path: str, data: bytes) -> None:
    """Write ``path`` whole, once: raise StateFileExists if it exists. On a local disk the
    content is synced before the name appears, so a crash leaves the whole file or none."""
    directory, name = posixpath.split(path)
    if isinstance(fs, pa_fs.LocalFileSystem):
        os.makedirs(directory, exist_ok=True)
        temporary = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            raise StateFileExists(f"{path} exists: another writer created it first") from None
        finally:
            os.unlink(temporary)
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        return
    if fs.get_file_info(path).type != pa_fs.FileType.NotFound:
        raise StateFileExists(f"{path} exists: another writer created it first")
    fs.create_dir(directory, recursive=True)
    temporary = f"{directory}/.{name}.{uuid.uuid4().hex}.tmp"
    with fs.open_output_stream(temporary) as stream:
        stream.write(data)
    fs.move(temporary, path)


class StateDirectory:
    """Durable state as JSON files, each created once and never overwritten."""

    IDENTITY = "input.identity"

    def __init__(self, location_uri: str):
        self.location = location_uri
        self._fs, self._path = filesystem(location_uri)
        self._created = False

    def _ensure(self) -> None:
        if not self._created:
            self._fs.create_dir(self._path, recursive=True)
            self._created = True

    def names(self, suffix: str) -> list[str]:
        self._ensure()
        infos = self._fs.get_file_info(pa_fs.FileSelector(self._path))
        return sorted(
            i.base_name
            for i in infos
            if i.base_name.endswith(suffix) and not i.base_name.startswith(".")
        )

    def read(self, name: str) -> Any:
        with self._fs.open_input_stream(f"{self._path}/{name}") as stream:
            return json.loads(stream.read())

    def write(self, name: str, value: Any) -> None:
        """Create ``name`` holding ``value``; StateFileExists (naming the location) if it
        exists, since state is written once: a second writer fails instead of corrupting."""
        self._ensure()
        try:
            create_file(self._fs, f"{self._path}/{name}", json.dumps(value).encode())
        except StateFileExists:
            raise StateFileExists(
                f"state file {name} at {self.location} was created by another writer while "
                "this one meant to: two drivers are using one state location (or checkpoint)"
            ) from None

    def remove(self, name: str) -> None:
        self._fs.delete_file(f"{self._path}/{name}")

    def claim(self, identity: dict[str, str]) -> None:
        """Refuse state kept for a different input: its positions would name other files."""
        if self.IDENTITY not in self.names(self.IDENTITY):
            try:
                self.write(self.IDENTITY, identity)
                return
            except StateFileExists:
                pass  # written meanwhile: compare with what was written
        kept = self.read(self.IDENTITY)
        if kept != identity:
            raise StorageError(
                f"the state at {self.location} was kept for {kept}, but this query reads "
                f"{identity}: start over with a new checkpoint and a new stateLocation"
            )
