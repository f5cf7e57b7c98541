"""Which snapshot chunk holds a key, and so which changes of that key its image already has.

Each chunk's image is its key range as of the chunk's high watermark, and the changelog
starts where the snapshot started, before every chunk. A change of a key is therefore
emitted only when its transaction ends after the high watermark of the chunk whose range
holds the key (Flink CDC's ``shouldEmit``): the changes up to that point are in the image,
the ones after it are not. A transaction ends at or before a high watermark exactly when
its commit record starts before it (records do not overlap), so the changelog can judge a
change by its transaction's commit LSN, which comes before the change, not after. Once the
changelog has passed the last chunk's high watermark, every chunk's image is behind it and
nothing needs filtering.

Chunks are consecutive key ranges: chunk ``i`` holds the keys after chunk ``i - 1``'s last
key up to its own last key; the final chunk has no last key and holds every key after.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from spark_jobs.sources.cdc.table import Key


@dataclass(frozen=True)
class SnapshotCoverage:
    """The chunks' last keys (every chunk's but the final one's, ascending) and the high
    watermark of each chunk, the final one included."""

    last_keys: tuple[Key, ...]
    high_watermarks: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.high_watermarks) != len(self.last_keys) + 1:
            raise ValueError(
                f"{len(self.last_keys)} last keys need {len(self.last_keys) + 1} high "
                f"watermarks (one per chunk, the final chunk's included), got "
                f"{len(self.high_watermarks)}"
            )
        if list(self.last_keys) != sorted(self.last_keys):
            raise ValueError("the chunks' last keys must be in ascending order")

    @classmethod
    def of(cls, chunks: Sequence[tuple[Key | None, int]]) -> SnapshotCoverage:
        """From (last key, high watermark) per chunk, in order; only the final chunk's last
        key is None."""
        keys = [key for key, _ in chunks]
        if not keys or keys[-1] is not None or None in keys[:-1]:
            raise ValueError("every chunk but the final one needs a last key, the final one none")
        return cls(tuple(keys[:-1]), tuple(watermark for _, watermark in chunks))

    @property
    def until(self) -> int:
        """The highest high watermark: changes that end after it are never in an image."""
        return max(self.high_watermarks)

    def high_watermark(self, key: Key) -> int:
        """The high watermark of the chunk whose range holds ``key``."""
        return self.high_watermarks[bisect_left(self.last_keys, key)]

    def has(self, key: Key, commit_lsn: int) -> bool:
        """Whether the image of ``key``'s chunk already holds the change of ``key`` by the
        transaction whose commit record starts at ``commit_lsn``."""
        return commit_lsn < self.high_watermark(key)
