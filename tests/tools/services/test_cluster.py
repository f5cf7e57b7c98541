import socket

import pytest

from tools.services.cluster import ClusterError, StandaloneCluster, main


def test_status_and_stop_without_a_started_cluster_say_so(tmp_path, capsys):
    for action in ("status", "stop"):
        assert main([action, "--dir", str(tmp_path)]) == 1
        assert capsys.readouterr().err == (
            f"scripts/spark-cluster: no cluster was started in {tmp_path} "
            f"({tmp_path}/cluster.json is missing)\n"
        )


def test_a_port_in_use_is_refused_by_number_before_any_daemon_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cluster = StandaloneCluster(tmp_path / "cluster", master_port=port)
        with pytest.raises(ClusterError, match=rf"^port\(s\) \[{port}\] on 127.0.0.1 are in use"):
            cluster.start()
    assert not (tmp_path / "cluster" / "master.log").exists()


def test_a_cluster_needs_a_worker(tmp_path):
    with pytest.raises(ValueError, match="workers = 0: a cluster needs at least one worker"):
        StandaloneCluster(tmp_path, workers=0)
