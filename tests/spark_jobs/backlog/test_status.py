from spark_jobs.backlog.status import BacklogModel, SourceStatus


def test_a_source_that_never_reported_is_not_in_backlog():
    model = BacklogModel(["files", "kafka"])
    assert not model.status("files").is_backlog
    assert not model.status("never-registered").is_backlog
    assert not model.job_is_backlog()


def test_last_report_wins():
    model = BacklogModel()
    model.report(SourceStatus("hybrid", is_backlog=True, phase="history"))
    assert model.job_is_backlog()
    model.report(SourceStatus("hybrid", is_backlog=False, phase="landing"))
    assert not model.job_is_backlog()
    assert model.status("hybrid").phase == "landing"
    model.report(SourceStatus("hybrid", is_backlog=True, phase="history"))
    assert model.job_is_backlog()


def test_job_is_in_backlog_if_any_running_source_is():
    model = BacklogModel()
    model.report(SourceStatus("live", is_backlog=False))
    model.report(SourceStatus("history", is_backlog=True))
    assert model.job_is_backlog()
    assert model.backlog_sources() == ["history"]


def test_a_finished_bounded_source_no_longer_counts():
    model = BacklogModel()
    model.report(SourceStatus("history", is_backlog=True))
    model.report(SourceStatus("live", is_backlog=False))
    model.report(SourceStatus("history", is_backlog=True, finished=True))
    assert not model.job_is_backlog()
    assert model.backlog_sources() == []


def test_json_form_carries_name_status_and_lag():
    status = SourceStatus(
        "hybrid", is_backlog=True, phase="history", lag={"files_behind": 12}, rule="hybrid-phase"
    )
    assert status.as_json() == {
        "name": "hybrid",
        "is_backlog": True,
        "finished": False,
        "phase": "history",
        "lag": {"files_behind": 12},
        "rule": "hybrid-phase",
    }


def test_json_form_carries_what_a_source_says_of_its_health_when_it_says_anything():
    status = SourceStatus("cdc", health={"slot_wal_status": "unreserved"})
    assert status.as_json()["health"] == {"slot_wal_status": "unreserved"}
    assert "health" not in SourceStatus("cdc").as_json()
