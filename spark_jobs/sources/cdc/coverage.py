"""Which snapshot chunk holds a key, and so which changes of that key its image already has.

Each chunk's image is its key range as of the chunk's high watermark, and the changelog
runs beside the snapshot from where it started. A change of a key is therefore emitted only
when its transaction ends after the high watermark of the chunk whose range holds the key
(Flink CDC's ``shouldEmit``): the changes up to that point are in the image, the ones after
it are not. A key no chunk has copied yet has no change emitted at all: its chunk, read
later, holds every change made before it. A transaction ends at or before a high
watermark exactly when its commit record starts before it (records do not overlap), so the
changelog can judge a change by its transaction's commit LSN, which comes before the
change, not after. Once the changelog has passed the last chunk's high watermark, every
chunk's image is behind it and nothing needs filtering.

Chunks are consecutive key ranges: chunk ``i`` holds the keys after chunk ``i - 1``'s last
key up to its own last key; the final chunk has no last key and holds every key after. While
the snapshot is under way, the last chunk so far has a last key, and the keys after it are
still to be copied.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from spark_jobs.sources.cdc.table import Key


@dataclass(frozen=True)
class SnapshotCoverage:
    """The chunks' last keys (ascending: every chunk's but the final one's once the snapshot
    is complete, every chunk's while it is under way) and the high watermark of each chunk."""

    last_keys: tuple[Key, ...]
    high_watermarks: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.high_watermarks) - len(self.last_keys) not in (0, 1):
            raise ValueError(
                f"{len(self.last_keys)} last keys need {len(self.last_keys)} high watermarks "
                f"(a snapshot under way) or {len(self.last_keys) + 1} (complete: the final "
                f"chunk's included), got {len(self.high_watermarks)}"
            )
        if list(self.last_keys) != sorted(self.last_keys):
            raise ValueError("the chunks' last keys must be in ascending order")

    @classmethod
    def of(cls, chunks: Sequence[tuple[Key | None, int]]) -> SnapshotCoverage:
        """From (last key, high watermark) per chunk copied, in order; only the final
        chunk's last key is None, and a snapshot under way has not copied it yet."""
        keys = [key for key, _ in chunks]
        if None in keys[:-1]:
            raise ValueError("every chunk but the final one needs a last key")
        if keys and keys[-1] is None:
            keys.pop()
        return cls(tuple(keys), tuple(watermark for _, watermark in chunks))

    @property
    def complete(self) -> bool:
        """Whether every key has been copied: the final chunk is among the chunks."""
        return len(self.high_watermarks) == len(self.last_keys) + 1

    @property
    def until(self) -> int | None:
        """The highest high watermark once complete: changes that end after it are never in
        an image. None while chunks are still to be copied, whose images hold any change."""
        return max(self.high_watermarks) if self.complete else None

    def high_watermark(self, key: Key) -> int | None:
        """The high watermark of the chunk whose range holds ``key``; None: not copied yet."""
        index = bisect_left(self.last_keys, key)
        return self.high_watermarks[index] if index < len(self.high_watermarks) else None

    def has(self, key: Key, commit_lsn: int) -> bool:
        """Whether the image of ``key``'s chunk holds (or, not copied yet, will hold) the
        change of ``key`` by the transaction whose commit record starts at ``commit_lsn``."""
        watermark = self.high_watermark(key)
        return watermark is None or commit_lsn < watermark
