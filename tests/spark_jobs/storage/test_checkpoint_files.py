import pytest

from spark_jobs.storage.checkpoint_files import FILE_SYSTEM_BASED, local_checkpoint_manager


@pytest.mark.parametrize(
    ("uri", "chosen", "expected"),
    [
        ("file:///data/ck", None, FILE_SYSTEM_BASED),
        ("file:///data/my%20ck", "", FILE_SYSTEM_BASED),
        ("file:///data/ck", "com.example.TheirManager", None),
        ("hdfs://namenode:8020/ck", None, None),
        ("s3://bucket/ck", None, None),
    ],
)
def test_only_a_local_checkpoint_without_a_chosen_manager_gets_the_file_system_api(
    uri, chosen, expected
):
    assert local_checkpoint_manager(uri, chosen) == expected
