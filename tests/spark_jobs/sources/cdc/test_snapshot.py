"""Chunks of a table's snapshot: the merge by key alone, then against a real PostgreSQL."""

import itertools
import threading
import time
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from sqlalchemy import text

from spark_jobs.sources.cdc.changes import RowChange
from spark_jobs.sources.cdc.messages import UNCHANGED, Column, Relation, Truncate
from spark_jobs.sources.cdc.slot import ReplicationSlot, SlotError
from spark_jobs.sources.cdc.snapshot import ChunkReader, KeyRange, Visibility, merge, read_chunk
from spark_jobs.sources.cdc.table import TableColumn, TableShape, ValueNotAtHand
from spark_jobs.sources.cdc.values import postgres_text
from spark_jobs.storage.files import StateFileExists
from tests.spark_jobs.sources.cdc.conftest import Transaction, as_events, non_c_collation

T = datetime(2026, 11, 25, tzinfo=UTC)
SHAPE = TableShape(
    10,
    "public.items",
    (TableColumn("id", "id", 23, "integer"), TableColumn("name", "name", 25, "text")),
    ("id",),
)
ITEMS = Relation(10, "public", "items", "d", (Column(1, "id", 23, -1), Column(0, "name", 25, -1)))
OTHER = Relation(11, "public", "other", "d", ITEMS.columns)
#: The read saw every transaction before xid 100, none from 100 on.
READ = Visibility(100, frozenset())
FIRST = KeyRange(None, (10,))
ROWS = [{"id": 2, "name": "b"}, {"id": 5, "name": "e"}, {"id": 9, "name": "i"}]


def insert(key: int, name: str, relation: Relation = ITEMS) -> RowChange:
    return RowChange("insert", relation, {"id": str(key), "name": name})


def update(key: int, name: str | object, old_key: int | None = None) -> RowChange:
    old = None if old_key is None else {"id": str(old_key)}
    return RowChange("update", ITEMS, {"id": str(key), "name": name}, old)


def delete(key: int) -> RowChange:
    return RowChange("delete", ITEMS, None, {"id": str(key)})


def tx(*changes, xid: int = 100, end: int = 0x200) -> Transaction:
    return Transaction(xid, end, T, changes)


def image_of(rows: list[dict], shape: TableShape = SHAPE) -> pa.Table:
    return pa.table(shape.arrow_columns(rows))


def rows_of(image: pa.Table, shape: TableShape = SHAPE) -> list[dict]:
    return [shape.row_at(image, i) for i in range(image.num_rows)]


def merged(*found: Transaction, keys: KeyRange = FIRST, high: int = 0x1000) -> list:
    image = merge(image_of(ROWS), as_events(*found), SHAPE, keys, high, READ)
    return [(r["id"], r["name"]) for r in rows_of(image)]


def test_inserts_updates_and_deletes_inside_the_range_apply_in_key_order():
    assert merged(tx(insert(7, "g"), update(2, "B"), delete(9), insert(1, "a"))) == [
        (1, "a"),
        (2, "B"),
        (5, "e"),
        (7, "g"),
    ]


def test_changes_outside_the_range_or_of_another_table_are_left_out():
    assert merged(tx(insert(11, "k"), update(12, "l"), delete(13), insert(3, "c", OTHER))) == [
        (2, "b"),
        (5, "e"),
        (9, "i"),
    ]
    assert merged(tx(insert(1, "a"), update(2, "B")), keys=KeyRange((2,), (9,))) == [
        (2, "b"),
        (5, "e"),
        (9, "i"),
    ]


def test_a_key_update_is_a_delete_of_the_old_key_and_an_insert_of_the_new():
    assert merged(tx(update(3, "moved", old_key=5))) == [(2, "b"), (3, "moved"), (9, "i")]
    assert merged(tx(update(30, "away", old_key=5))) == [(2, "b"), (9, "i")]
    assert merged(tx(update(4, "in", old_key=40))) == [(2, "b"), (4, "in"), (5, "e"), (9, "i")]


def test_a_transaction_across_two_chunks_changes_each_in_its_own_range():
    both = tx(update(5, "E"), update(15, "O"), delete(9), insert(12, "l"))
    second = [{"id": 11, "name": "k"}, {"id": 15, "name": "o"}]
    assert merged(both) == [(2, "b"), (5, "E")]
    for high, expected in [
        (99, [(11, "k"), (15, "o")]),
        (0x200, [(11, "k"), (12, "l"), (15, "O")]),
    ]:
        image = merge(image_of(second), as_events(both), SHAPE, KeyRange((10,), None), high, READ)
        assert [(r["id"], r["name"]) for r in rows_of(image)] == expected


def test_only_transactions_the_read_missed_that_end_by_the_high_watermark_apply():
    seen = tx(update(2, "seen"), xid=99)
    late = tx(update(5, "late"), xid=101, end=0x1001)
    missed = tx(update(9, "missed"), xid=90)
    running = Visibility(100, frozenset({90}))
    image = merge(image_of(ROWS), as_events(missed, seen, late), SHAPE, FIRST, 0x1000, running)
    assert image.column("name").to_pylist() == ["b", "e", "missed"]
    # Seen or applied, every transaction that ends by the high watermark is in the image.


def test_later_transactions_win_and_a_truncate_empties_the_chunk():
    assert merged(tx(update(2, "x")), tx(update(2, "y"), xid=101)) == [(2, "y"), (5, "e"), (9, "i")]
    assert merged(tx(Truncate(0, (11, 10))), tx(insert(3, "c"), xid=101)) == [(3, "c")]
    assert merged(tx(Truncate(0, (11,)))) == [(2, "b"), (5, "e"), (9, "i")]


def test_a_value_an_update_left_unchanged_is_kept_from_the_image():
    assert merged(tx(update(5, UNCHANGED), update(3, UNCHANGED, old_key=9))) == [
        (2, "b"),
        (3, "i"),
        (5, "e"),
    ]
    # Moved in from a key outside the chunk: the value is not at hand, the read is retried.
    with pytest.raises(ValueNotAtHand, match=r"to key \[4\] .* from key \[40\], whose row"):
        merged(tx(update(4, UNCHANGED, old_key=40)))


def test_a_composite_key_range_compares_whole_keys():
    shape = TableShape(
        12,
        "public.pairs",
        (TableColumn("a", "a", 23, "integer"), TableColumn("b", "b", 25, "text")),
        ("a", "b"),
    )
    pairs = Relation(12, "public", "pairs", "d", (Column(1, "a", 23, -1), Column(1, "b", 25, -1)))
    rows = [{"a": 1, "b": "m"}, {"a": 2, "b": "c"}]
    inserts = tx(
        *(
            RowChange("insert", pairs, {"a": a, "b": b})
            for a, b in [("1", "a"), ("1", "z"), ("2", "a"), ("2", "d"), ("3", "a")]
        )
    )
    keys = KeyRange((1, "m"), (2, "c"))
    image = merge(image_of(rows, shape), as_events(inserts), shape, keys, 0x1000, READ)
    assert [(r["a"], r["b"]) for r in rows_of(image, shape)] == [
        (1, "m"),
        (1, "z"),
        (2, "a"),
        (2, "c"),
    ]


@pytest.mark.parametrize(
    ("xid", "sees"),
    [(2**32 - 5, True), (3, False), (2**32 - 1, False), (2**31 + 10, True)],
)
def test_decoded_xids_are_read_in_the_epoch_nearest_the_snapshot(xid, sees):
    # xmax just past the wrap to epoch 1: 32-bit 2**32 - 5 is epoch 0's, 3 is epoch 1's.
    visibility = Visibility.parse(f"{2**32 - 10}:{2**32 + 2}:{2**32 - 1}")
    assert visibility.sees(xid) is sees


# Against a real PostgreSQL ------------------------------------------------------------

_tables = itertools.count()


@pytest.fixture
def table(database):
    """A table of 3,000 rows with even ids 2..6000; every write increments ``version``."""
    name = f"items_{next(_tables)}"
    with database.begin() as connection:
        connection.execute(
            text(f"CREATE TABLE {name} (id int PRIMARY KEY, version int NOT NULL, note text)")
        )
        connection.execute(
            text(f"INSERT INTO {name} SELECT 2 * i, 1, 'n' || i FROM generate_series(1, 3000) i")
        )
    return name


def slot_for(logical_server, table: str) -> ReplicationSlot:
    slot = ReplicationSlot(logical_server.url, f"slot_{table}", f"pub_{table}", table)
    slot.ensure()
    return slot


@pytest.fixture
def slot(logical_server, table):
    slot = slot_for(logical_server, table)
    yield slot
    slot.drop()
    slot.close()


@pytest.fixture
def reader(logical_server, table, slot):
    reader = ChunkReader(logical_server.url, table, slot)
    yield reader
    reader.close()


def write(database, *statements: str) -> None:
    with database.begin() as connection:
        for statement in statements:
            connection.execute(text(statement))


def read_all(reader: ChunkReader, chunk_rows: int, directory) -> list[tuple]:
    """Every chunk from the first to the last, as (chunk, rows)."""
    chunks, after = [], None
    for number in itertools.count():
        chunk = reader.next_chunk(after, chunk_rows, str(directory / f"chunk-{number}.arrow"))
        chunks.append((chunk, read_chunk(chunk.path).to_pylist()))
        if chunk.last_key is None:
            return chunks
        after = chunk.last_key


def test_chunks_hold_every_row_once_in_key_order(logical_server, database, tmp_path):
    write(
        database,
        "CREATE TABLE ints (id bigint PRIMARY KEY, v int)",
        "INSERT INTO ints SELECT i * 3, i FROM generate_series(1, 10000) i",
        'CREATE TABLE pairs (a int, b text COLLATE "C", v int, PRIMARY KEY (a, b))',
        "INSERT INTO pairs SELECT i / 100, lpad((i % 100)::text, 3, 'x'), i "
        "FROM generate_series(0, 9999) i",
    )
    for name, key in (("ints", ["id"]), ("pairs", ["a", "b"])):
        slot = slot_for(logical_server, name)
        reader = ChunkReader(logical_server.url, name, slot)
        try:
            chunks = read_all(reader, 1000, tmp_path / name)
        finally:
            reader.close()
            slot.drop()
            slot.close()
        assert [chunk.rows for chunk, _ in chunks] == [1000] * 10 + [0]
        keys = [tuple(row[k] for k in key) for _, rows in chunks for row in rows]
        with database.connect() as connection:
            expected = connection.execute(text(f"SELECT {', '.join(key)} FROM {name}")).all()
        assert keys == sorted(keys) and len(set(keys)) == 10_000
        assert set(keys) == {tuple(row) for row in expected}
        assert [chunk.last_key for chunk, _ in chunks[:2]] == [list(keys[999]), list(keys[1999])]


@pytest.mark.parametrize(
    ("key_type", "key"),
    [
        ("timestamptz", "timestamptz '2026-01-01 00:00:00+05:30' + i * interval '1 hour'"),
        ("uuid", "md5(i::text)::uuid"),
        ("numeric(8, 2)", "i * 0.75"),
        ("date", "date '2026-01-01' + i"),
        # Ordered without its padding: 'a' < 'a' || chr(1) < 'ab', where the padded bytes
        # put chr(1) before the padding's space.
        (
            'char(3) COLLATE "C"',
            "chr(97 + i / 3) || CASE i % 3 WHEN 1 THEN chr(1) WHEN 2 THEN 'b' ELSE '' END",
        ),
    ],
)
def test_keys_of_every_chunkable_type_resume_after_the_last(
    logical_server, database, tmp_path, key_type, key
):
    name = f"keyed_{next(_tables)}"
    write(
        database,
        f"CREATE TABLE {name} (k {key_type} PRIMARY KEY, i int)",
        f"INSERT INTO {name} SELECT {key}, i FROM generate_series(1, 25) i",
    )
    slot = slot_for(logical_server, name)
    reader = ChunkReader(logical_server.url, name, slot)
    try:
        chunks = read_all(reader, 10, tmp_path)
    finally:
        reader.close()
        slot.drop()
        slot.close()
    assert [chunk.rows for chunk, _ in chunks] == [10, 10, 5]
    with database.connect() as connection:
        in_key_order = connection.execute(text(f"SELECT i FROM {name} ORDER BY k")).scalars()
        assert [row["i"] for _, rows in chunks for row in rows] == list(in_key_order)


def test_writes_during_the_read_are_merged_into_the_chunk(reader, table, database, tmp_path):
    bump = f"UPDATE {table} SET version = version + 1"
    steps = {
        # Between the low watermark and the read: the read sees these.
        "low": [
            f"{bump} WHERE id BETWEEN 2 AND 100",
            f"DELETE FROM {table} WHERE id BETWEEN 120 AND 140",
            f"INSERT INTO {table} VALUES (151, 1, 'odd')",
        ],
        # After the read, before the high watermark: the merge must apply these, though
        # committed without waiting for the WAL to be flushed.
        "read": [
            "SET LOCAL synchronous_commit = off",
            f"{bump} WHERE id BETWEEN 50 AND 200",
            f"DELETE FROM {table} WHERE id BETWEEN 300 AND 320",
            f"{bump}, id = 6001 WHERE id = 400",  # out of the chunk
            f"{bump}, id = 401 WHERE id = 4000",  # into the chunk
            f"INSERT INTO {table} VALUES (501, 1, 'odd')",
            f"{bump}, note = 'late' WHERE id = 2020",  # the chunk's last key
            f"{bump} WHERE id = 2022",  # the next chunk's
        ],
    }
    chunk = reader.next_chunk(
        None, 1000, str(tmp_path / "c.arrow"), lambda step: write(database, *steps[step])
    )

    # The read's 1,000 rows: the even ids up to 2,000, less the 11 deleted, with 151 and
    # ten more even ids.
    assert chunk.last_key == [2020]
    with database.connect() as connection:
        expected = connection.execute(
            text(f"SELECT id, version, note FROM {table} WHERE id <= 2020 ORDER BY id")
        ).all()
    image = read_chunk(chunk.path)
    assert [tuple(row.values())[:3] for row in image.to_pylist()] == [tuple(r) for r in expected]
    assert chunk.rows == len(expected) == 1000 - 11 - 1 + 1 + 1
    assert set(image.column("_op").to_pylist()) == {"snapshot"}
    assert set(image.column("_lsn").to_pylist()) == {chunk.high_watermark}
    assert image.column("_commit_time").null_count == len(expected)
    assert set(map(tuple, image.column("_unchanged").to_pylist())) == {()}
    assert chunk.low_watermark < chunk.high_watermark


def test_a_chunk_file_is_written_once_and_reads_the_same_twice(reader, tmp_path):
    chunk = reader.next_chunk([100], 50, str(tmp_path / "c.arrow"))
    first, second = read_chunk(chunk.path), read_chunk(chunk.path)
    assert first.equals(second) and first.num_rows == 50
    assert first.column_names == [
        "id",
        "version",
        "note",
        "_op",
        "_lsn",
        "_seq",
        "_commit_time",
        "_unchanged",
    ]
    assert first.column("id").to_pylist() == list(range(102, 201, 2))
    with pytest.raises(StateFileExists):
        reader.next_chunk([100], 50, chunk.path)
    assert read_chunk(chunk.path).equals(first)


def test_a_slot_advanced_past_the_low_watermark_is_refused(reader, slot, table, database, tmp_path):
    def advance_meanwhile(step: str) -> None:
        if step == "low":
            write(database, f"UPDATE {table} SET version = version + 1 WHERE id = 2")
            slot.advance(slot.peek()[-1].lsn)

    with pytest.raises(SlotError, match=r"past the low watermark .* of a chunk of public\.items"):
        reader.next_chunk(None, 10, str(tmp_path / "c.arrow"), advance_meanwhile)
    assert not (tmp_path / "c.arrow").exists()


def test_a_key_stored_out_of_line_is_taken_from_the_old_key_a_change_names(
    logical_server, database, tmp_path
):
    """An update of another column sends a TOASTed key as unchanged in the new row, and the
    key whole in the old one: the merge took the new row's placeholder for the key."""
    keys = [f"k{i:03d}/" + "x" * 2_500 for i in range(8)]
    write(
        database,
        'CREATE TABLE long_keys (id text COLLATE "C" PRIMARY KEY, name text)',
        "ALTER TABLE long_keys ALTER COLUMN id SET STORAGE EXTERNAL",
        *(f"INSERT INTO long_keys VALUES ('{key}', 'n')" for key in keys),
    )
    slot = slot_for(logical_server, "long_keys")
    reader = ChunkReader(logical_server.url, "long_keys", slot)
    updates = iter([f"UPDATE long_keys SET name = 'during' WHERE id = '{keys[2]}'"])

    def update_once(step: str) -> None:
        if step == "read" and (statement := next(updates, None)):
            write(database, statement)

    try:
        chunk = reader.next_chunk(None, 5, str(tmp_path / "c.arrow"), update_once)
    finally:
        reader.close()
        slot.drop()
        slot.close()
    image = read_chunk(chunk.path).to_pylist()
    assert [(row["id"][:4], row["name"]) for row in image] == [
        ("k000", "n"), ("k001", "n"), ("k002", "during"), ("k003", "n"), ("k004", "n")
    ]  # fmt: skip


def test_a_row_moved_in_from_outside_with_its_toasted_value_unsent_is_read_again(
    reader, table, database, tmp_path
):
    """Moved from key 4000 (another chunk's) to 401 after the read, before the high
    watermark: the update sends no ``note``, and row 4000 is not in the image. A second read
    sees the row whole."""
    write(
        database,
        f"ALTER TABLE {table} ALTER COLUMN note SET STORAGE EXTERNAL",
        f"UPDATE {table} SET note = repeat('x', 5000) || id WHERE id = 4000",
    )
    moves = iter([f"UPDATE {table} SET id = 401, version = 2 WHERE id = 4000"])

    def move_once(step: str) -> None:
        if step == "read" and (statement := next(moves, None)):
            write(database, statement)

    chunk = reader.next_chunk(None, 1000, str(tmp_path / "c.arrow"), move_once)
    moved = [row for row in read_chunk(chunk.path).to_pylist() if row["id"] == 401]
    assert [(r["version"], r["note"]) for r in moved] == [(2, "x" * 5000 + "4000")]


def test_a_commit_written_before_the_low_watermark_but_not_yet_visible_is_merged(
    reader, table, database, tmp_path
):
    """A commit's WAL record comes before its visibility. Synchronous replication to a standby
    that never answers holds a commit between the two, so its end is before the low watermark
    while the read cannot see it: a merge of (low, high] alone would lose it."""
    admin = database.execution_options(isolation_level="AUTOCOMMIT")

    def standby(names: str) -> None:
        with admin.connect() as connection:
            connection.execute(text(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'"))
            connection.execute(text("SELECT pg_reload_conf()"))

    def waits_for_the_standby(committer: threading.Thread) -> bool:
        with admin.connect() as connection:
            while committer.is_alive():
                if connection.execute(
                    text("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
                ).scalar():
                    return True
                time.sleep(0.01)
        return False

    def release(step: str) -> None:
        if step == "read":
            standby("")
            committer.join(10)

    standby("nobody")
    deadline = time.monotonic() + 10
    try:
        # Until the server has taken the setting in, a commit does not wait: commit again.
        while True:
            committer = threading.Thread(
                target=write, args=(database, f"UPDATE {table} SET version = version + 1")
            )
            committer.start()
            if waits_for_the_standby(committer):
                break
            assert time.monotonic() < deadline, "no commit waited for the standby"
        chunk = reader.next_chunk(None, 10, str(tmp_path / "c.arrow"), release)
    finally:
        standby("")
        committer.join(10)
    with database.connect() as connection:
        expected = connection.execute(text(f"SELECT version FROM {table} WHERE id = 2")).scalar()
    assert read_chunk(chunk.path).to_pylist()[0]["version"] == expected > 1


def test_a_chunk_reads_each_value_as_its_output_function_writes_it(
    logical_server, database, tmp_path
):
    """The snapshot reads through COPY, as the changelog decodes, the types' output text: a
    NULL is not an empty string, a char(n) keeps its padding, a boolean is 't' or 'f'
    (a cast to text would give 'true' and lose the padding)."""
    write(
        database,
        'CREATE TABLE shown (id int PRIMARY KEY, "a note" text, code char(4), ok bool)',
        "INSERT INTO shown VALUES (1, NULL, 'ab', true), (2, '', NULL, false), "
        "(3, 'line\nbreak \"quoted\", comma', 'abcd', NULL)",
    )
    slot = slot_for(logical_server, "shown")
    reader = ChunkReader(logical_server.url, "shown", slot)
    try:
        chunk = reader.next_chunk(None, 10, str(tmp_path / "c.arrow"))
        rows = read_chunk(chunk.path).select(["id", "a note", "code", "ok"]).to_pylist()
    finally:
        reader.close()
        slot.drop()
        slot.close()
    assert rows == [
        {"id": 1, "a note": None, "code": "ab  ", "ok": True},
        {"id": 2, "a note": "", "code": None, "ok": False},
        {"id": 3, "a note": 'line\nbreak "quoted", comma', "code": "abcd", "ok": None},
    ]


def test_a_key_of_a_domain_with_another_collation_is_chunked_and_refreshed(
    logical_server, database, tmp_path
):
    """A domain's collation and the column's own met in a refresh's ``IN``, which PostgreSQL
    refused ("could not determine which collation to use"): keys are compared under one
    collation named in the query, there as in the chunks."""
    collation = non_c_collation(database)
    write(
        database,
        f'CREATE DOMAIN worded_text AS text COLLATE "{collation}"',
        'CREATE TABLE domained (k worded_text COLLATE "C" PRIMARY KEY, v int)',
        "INSERT INTO domained VALUES ('a', 1), ('B', 2), ('c', 3)",
    )
    slot = slot_for(logical_server, "domained")
    reader = ChunkReader(logical_server.url, "domained", slot)
    try:
        chunk = reader.next_chunk(None, 2, str(tmp_path / "c.arrow"))
        refresh = reader.refresh([("c",), ("zz",)], str(tmp_path / "r.arrow"))
        chunked = read_chunk(chunk.path).column("k").to_pylist()
    finally:
        reader.close()
        slot.drop()
        slot.close()
    assert chunked == ["B", "a"]
    assert (refresh.rows, sorted(refresh.keys)) == (1, [["c"], ["zz"]])


def test_a_chunk_of_every_kind_of_value_keeps_the_values_the_changes_left_unchanged():
    """A numeric key (ordered as numbers, not as text), names with spaces and quotes, and
    values Python's datetime cannot hold: an update that leaves them unchanged takes them
    from the Arrow image exactly; new keys fall into numeric order."""
    columns = (
        TableColumn("amount id", '"amount id"', 1700, "numeric"),
        TableColumn('due "day"', '"due ""day"""', 1082, "date"),
        TableColumn("seen at", '"seen at"', 1184, "timestamp with time zone"),
        TableColumn("raw", "raw", 17, "bytea"),
        TableColumn("ratio", "ratio", 700, "real"),
    )
    shape = TableShape(13, "public.ledger", columns, ("amount id",))
    ledger = Relation(
        13, "public", "ledger", "d", tuple(Column(i == 0, c.name, c.type_oid, -1)
                                           for i, c in enumerate(columns))
    )  # fmt: skip
    texts = pa.table(
        {
            "amount id": ["9.5", "10", "100"],
            "due": ["infinity", "0044-03-15 BC", None],
            "seen": ["12024-01-02 03:04:05.000001+00", "-infinity", "2026-11-27 00:00:00+00"],
            "raw": ["\\x00ff", "\\x", None],
            "ratio": ["NaN", "-0", "3.4028235e+38"],
        }
    )
    image = shape.typed_table(texts)
    names = [c.name for c in columns]
    seen = texts["seen"].to_pylist()

    def update(key: str) -> RowChange:
        return RowChange("update", ledger, dict(zip(names, [key, *[UNCHANGED] * 4], strict=True)))

    def insert(key: str) -> RowChange:
        values = [key, "2024-02-29", None, None, "1"]
        return RowChange("insert", ledger, dict(zip(names, values, strict=True)))

    merged = merge(
        image, as_events(tx(update("10"), insert("11"), insert("9.75"))), shape,
        KeyRange(None, None), 0x1000, READ,
    )  # fmt: skip
    expected = shape.typed_table(
        pa.table(
            {
                "amount id": ["9.5", "9.75", "10", "11", "100"],
                "due": ["infinity", "2024-02-29", "0044-03-15 BC", "2024-02-29", None],
                "seen": [seen[0], None, "-infinity", None, seen[2]],
                "raw": ["\\x00ff", None, "\\x", None, None],
                "ratio": ["NaN", "1", "-0", "1", "3.4028235e+38"],
            }
        )
    )
    for column in columns:
        written = postgres_text(merged.column(column.name), column.kind.oid).to_pylist()
        assert written == postgres_text(expected.column(column.name), column.kind.oid).to_pylist()
