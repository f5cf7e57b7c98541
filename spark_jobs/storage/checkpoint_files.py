"""How Spark writes the files of a checkpoint on a local disk.

Spark writes each file of a checkpoint (offsets, commits, state) through a checkpoint file
manager, by default on Hadoop's FileContext API. On a local disk that API asks, for the file
and for its checksum file, whether each side of the final rename is a symbolic link by
starting a ``readlink`` process: eight processes a file, about 50 ms on two cores, and a
micro-batch writes several files. Hadoop's FileSystem API renames a local file with one
rename(2). Neither makes the rename onto an existing file exclusive on a local disk
(FileContext's local rename checks the target, then renames), so the switch gives up no
guarantee: the lease keeps a second driver out either way. HDFS and object stores keep
Spark's choice, as does a manager the user names.
"""

from __future__ import annotations

from urllib.parse import urlsplit

#: Spark's (internal) setting of the manager; read when a query starts.
MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"
FILE_SYSTEM_BASED = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def local_checkpoint_manager(checkpoint_uri: str, chosen: str | None) -> str | None:
    """The manager to set for a checkpoint at ``checkpoint_uri`` (an absolute URI), or None
    to leave Spark's: the user ``chosen`` one, or a checkpoint that is not on a local disk."""
    if chosen or urlsplit(checkpoint_uri).scheme != "file":
        return None
    return FILE_SYSTEM_BASED
