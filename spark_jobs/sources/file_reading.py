"""Reading input files with pyarrow: admitting a file whole, and a task's row slices.

A file is read in full (parquet: its footer) before it is admitted, so a malformed file
is refused by name before any of its rows count; a slice is read only from a file whose
size and modification time are still those admitted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from spark_jobs.sources.children import ReadablePartition
from spark_jobs.sources.file_manifest import FileEntry
from spark_jobs.storage.files import ListedFile, StorageError, filesystem, stat_file

FORMATS = ("parquet", "json", "csv")


class InputFileError(StorageError):
    """A file that cannot be read as declared; the message names it."""


def _open(uri: str) -> pa.NativeFile:
    fs, path = filesystem(uri)
    return fs.open_input_file(path)


def check_columns(names: list[str], schema: pa.Schema) -> None:
    missing = [name for name in schema.names if name not in names]
    if missing:
        raise ValueError(f"missing columns {missing}; the file has {names}")


def _cast(table: pa.Table, schema: pa.Schema) -> pa.Table:
    check_columns(table.column_names, schema)
    return table.select(schema.names).cast(schema)


def _reads_as(found: pa.DataType, wanted: pa.DataType) -> bool:
    """A parquet column of type ``found`` reads as ``wanted`` without losing values: the
    same type, a wider number, another timestamp unit or zone, another string encoding."""
    t = pa.types
    if t.is_dictionary(found):
        found = found.value_type
    if found.equals(wanted):
        return True
    if t.is_integer(wanted) and t.is_integer(found):
        # A signed integer holds a narrower signed or unsigned one.
        return found.bit_width < wanted.bit_width or (
            found.bit_width == wanted.bit_width and t.is_signed_integer(found)
        )
    if t.is_floating(wanted):
        if t.is_floating(found):
            return found.bit_width <= wanted.bit_width
        return t.is_integer(found) and found.bit_width <= 32
    families = (
        (t.is_timestamp,),
        (t.is_string, t.is_large_string),
        (t.is_binary, t.is_large_binary),
    )
    for family in families:
        if any(check(wanted) for check in family):
            return any(check(found) for check in family)
    return False


def check_types(file_schema: pa.Schema, schema: pa.Schema) -> None:
    """Refuse, naming every column, a file whose column types the schema cannot take:
    casting an empty table (all a footer gives) would accept strings as numbers."""
    wrong = [
        f"{field.name} is {file_schema.field(field.name).type}, not {field.type}"
        for field in schema
        if field.name in file_schema.names
        and not _reads_as(file_schema.field(field.name).type, field.type)
    ]
    if wrong:
        raise ValueError(f"column types do not match the schema: {'; '.join(wrong)}")


def _csv_timestamps(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """CSV timestamps without a zone are taken as UTC, like Spark with a UTC session zone."""
    for index, target in enumerate(schema):
        if not pa.types.is_timestamp(target.type) or target.type.tz is None:
            continue
        text = table.column(target.name)
        try:
            converted = text.cast(target.type)
        except pa.ArrowInvalid:
            naive = text.cast(pa.timestamp(target.type.unit))
            converted = pc.assume_timezone(naive, target.type.tz)
        table = table.set_column(index, target.name, converted)
    return table


def read_table(uri: str, fmt: str, schema: pa.Schema) -> pa.Table:
    """The whole file as a table of ``schema``."""
    with _open(uri) as handle:
        if fmt == "parquet":
            table = pq.read_table(handle, columns=schema.names)
        elif fmt == "json":
            parse = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
            table = pa_json.read_json(handle, parse_options=parse)
        else:
            as_text = pa.schema(
                [f.with_type(pa.string()) if pa.types.is_timestamp(f.type) else f for f in schema]
            )
            options = pa_csv.ConvertOptions(
                column_types=as_text, include_columns=schema.names, strings_can_be_null=True
            )
            table = _csv_timestamps(pa_csv.read_csv(handle, convert_options=options), schema)
    return _cast(table, schema)


def admit(listed: ListedFile, fmt: str, schema: pa.Schema) -> FileEntry:
    """Read the file in full (parquet: its footer and schema) and count its rows."""
    try:
        if fmt == "parquet":
            with _open(listed.uri) as handle:
                parquet = pq.ParquetFile(handle)
                # From the footer's schema alone: an empty table would import pandas into
                # the planner process, 0.5-1.3 s at every query start.
                check_columns(parquet.schema_arrow.names, schema)
                check_types(parquet.schema_arrow, schema)
                rows = parquet.metadata.num_rows
        else:
            rows = read_table(listed.uri, fmt, schema).num_rows
    except Exception as error:
        raise InputFileError(f"cannot read {fmt} input file {listed.uri}: {error}") from error
    return FileEntry(listed.uri, listed.size, listed.mtime_ns, rows)


@dataclass(frozen=True)
class FileSlice:
    """Rows ``[start, stop)`` of one admitted file."""

    entry: FileEntry
    fmt: str
    start: int
    stop: int

    def read(self, schema: pa.Schema) -> pa.Table:
        try:
            self._check_unchanged()
            if self.fmt == "parquet":
                return self._read_parquet(schema)
            table = read_table(self.entry.uri, self.fmt, schema)
            return table.slice(self.start, self.stop - self.start)
        except InputFileError:
            raise
        except Exception as error:
            raise InputFileError(
                f"cannot read {self.fmt} input file {self.entry.uri} "
                f"(rows {self.start}-{self.stop}): {error}"
            ) from error

    def _check_unchanged(self) -> None:
        now = stat_file(self.entry.uri)
        if (now.size, now.mtime_ns) != (self.entry.size, self.entry.mtime_ns):
            raise InputFileError(
                f"input file {self.entry.uri} changed after it was admitted (size "
                f"{self.entry.size} -> {now.size}, modified {self.entry.mtime_ns} -> "
                f"{now.mtime_ns} ns); input files must not be modified"
            )

    def _read_parquet(self, schema: pa.Schema) -> pa.Table:
        with _open(self.entry.uri) as handle:
            parquet = pq.ParquetFile(handle)
            groups, first_row, offset = [], None, 0
            for index in range(parquet.metadata.num_row_groups):
                size = parquet.metadata.row_group(index).num_rows
                if offset + size > self.start and offset < self.stop:
                    groups.append(index)
                    first_row = offset if first_row is None else first_row
                offset += size
            if not groups:
                return schema.empty_table()
            table = parquet.read_row_groups(groups, columns=schema.names)
        table = table.slice(self.start - (first_row or 0), self.stop - self.start)
        return _cast(table, schema)


class FileSlicesPartition(ReadablePartition):
    """Consecutive file slices read by one Spark task."""

    def __init__(self, slices: list[FileSlice]):
        self.slices = slices

    def read(self, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        for piece in self.slices:
            yield from piece.read(schema).to_batches(max_chunksize=65_536)
