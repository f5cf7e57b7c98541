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

A refresh is a later image of some keys already copied (``snapshot.ChunkReader.refresh``):
where the changelog cannot complete a row (a key move that left a TOASTed value unsent), the
key is read again, and its image stands for every change of it up to the refresh's own high
watermark. For such a key the later of the two watermarks decides.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from spark_jobs.sources.cdc.table import Key


@dataclass(frozen=True)
class SnapshotCoverage:
    """The chunks' last keys (ascending: every chunk's but the final one's once the snapshot
    is complete, every chunk's while it is under way), the high watermark of each chunk, and
    the latest refresh's high watermark of each key refreshed."""

    last_keys: tuple[Key, ...]
    high_watermarks: tuple[int, ...]
    refreshed: Mapping[Key, int] = field(default_factory=dict)

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
    def of(
        cls,
        chunks: Sequence[tuple[Key | None, int]],
        refreshes: Iterable[tuple[Iterable[Key], int]] = (),
    ) -> SnapshotCoverage:
        """From (last key, high watermark) per chunk copied, in order (only the final chunk's
        last key is None, and a snapshot under way has not copied it yet), and (keys, high
        watermark) per refresh."""
        keys = [key for key, _ in chunks]
        if None in keys[:-1]:
            raise ValueError("every chunk but the final one needs a last key")
        if keys and keys[-1] is None:
            keys.pop()
        refreshed: dict[Key, int] = {}
        for refreshed_keys, watermark in refreshes:
            for key in refreshed_keys:
                refreshed[key] = max(watermark, refreshed.get(key, watermark))
        return cls(tuple(keys), tuple(watermark for _, watermark in chunks), refreshed)

    @property
    def complete(self) -> bool:
        """Whether every key has been copied: the final chunk is among the chunks."""
        return len(self.high_watermarks) == len(self.last_keys) + 1

    @property
    def until(self) -> int | None:
        """The highest high watermark (refreshes' included) once complete: changes that end
        after it are never in an image. None while chunks are still to be copied, whose
        images hold any change."""
        if not self.complete:
            return None
        return max([*self.high_watermarks, *self.refreshed.values()])

    def high_watermark(self, key: Key) -> int | None:
        """The high watermark of the chunk whose range holds ``key``; None: not copied yet."""
        index = bisect_left(self.last_keys, key)
        return self.high_watermarks[index] if index < len(self.high_watermarks) else None

    def has(self, key: Key, commit_lsn: int) -> bool:
        """Whether the image of ``key``'s chunk holds (or, not copied yet, will hold) the
        change of ``key`` by the transaction whose commit record starts at ``commit_lsn``."""
        refreshed = self.refreshed.get(key)
        if refreshed is not None and commit_lsn < refreshed:
            return True
        watermark = self.high_watermark(key)
        return watermark is None or commit_lsn < watermark
