import pytest

from spark_jobs.sources.cdc.coverage import SnapshotCoverage

#: Chunks (..10], (10..20], (20..): high watermarks 100, 300, 200.
COVERAGE = SnapshotCoverage.of([((10,), 100), ((20,), 300), (None, 200)])


@pytest.mark.parametrize(
    ("key", "watermark"),
    [((1,), 100), ((10,), 100), ((11,), 300), ((20,), 300), ((21,), 200), ((10**9,), 200)],
)
def test_a_key_belongs_to_the_chunk_whose_range_holds_it(key, watermark):
    assert COVERAGE.high_watermark(key) == watermark


def test_a_change_is_in_the_image_when_its_commit_starts_before_the_high_watermark():
    assert COVERAGE.has((5,), 99)
    assert not COVERAGE.has((5,), 100)
    assert COVERAGE.has((15,), 250)
    assert not COVERAGE.has((25,), 250)


def test_nothing_after_the_highest_watermark_is_in_any_image():
    assert COVERAGE.until == 300


def test_composite_keys_compare_as_tuples():
    coverage = SnapshotCoverage.of([(("a", 2), 10), (None, 20)])
    assert coverage.high_watermark(("a", 1)) == 10
    assert coverage.high_watermark(("a", 3)) == 20


def test_a_single_chunk_covers_every_key():
    assert SnapshotCoverage.of([(None, 7)]).high_watermark((42,)) == 7


def test_while_the_snapshot_runs_a_key_not_copied_yet_has_every_change_left_to_its_chunk():
    """Its chunk, read later, holds what any change before it did: none is emitted."""
    copying = SnapshotCoverage.of([((10,), 100), ((20,), 300)])
    assert not copying.complete and copying.until is None
    assert copying.high_watermark((21,)) is None
    assert copying.has((21,), 10**9)
    assert not copying.has((15,), 300) and copying.has((15,), 299)
    nothing = SnapshotCoverage.of([])
    assert nothing.has((1,), 10**9) and nothing.until is None


def test_the_final_chunk_completes_the_coverage():
    assert COVERAGE.complete
    assert not COVERAGE.has((10**9,), 200)


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ([(None, 5), (None, 6)], "every chunk but the final one"),
        ([(None, 5), ((1,), 6)], "every chunk but the final one"),
        ([((2,), 5), ((1,), 6), (None, 7)], "ascending"),
    ],
)
def test_chunks_out_of_shape_are_refused(chunks, message):
    with pytest.raises(ValueError, match=message):
        SnapshotCoverage.of(chunks)


def test_high_watermarks_that_match_no_count_of_chunks_are_refused():
    with pytest.raises(ValueError, match="1 last keys need 1 high watermarks"):
        SnapshotCoverage(((1,),), (1, 2, 3))


def test_a_refreshed_key_s_changes_up_to_the_refresh_are_in_its_image_and_no_other_key_s():
    refreshed = SnapshotCoverage.of(
        [((10,), 100), ((20,), 300), (None, 200)], [([(5,), (15,)], 400), ([(5,)], 500)]
    )
    assert refreshed.has((5,), 499) and not refreshed.has((5,), 500)
    assert refreshed.has((15,), 399) and not refreshed.has((15,), 400)
    assert not refreshed.has((6,), 100) and refreshed.has((6,), 99)
    assert refreshed.until == 500


def test_a_refresh_older_than_its_chunk_changes_nothing():
    coverage = SnapshotCoverage.of([((10,), 100), (None, 300)], [([(15,)], 200)])
    assert coverage.has((15,), 250) and not coverage.has((15,), 300)
    assert coverage.until == 300


def test_while_the_snapshot_runs_refreshes_make_no_until():
    assert SnapshotCoverage.of([((10,), 100)], [([(5,)], 200)]).until is None
