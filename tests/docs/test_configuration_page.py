from pathlib import Path

from spark_jobs.backlog.options import render_page

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_committed_configuration_page_matches_the_options():
    assert PAGE.read_text(encoding="utf-8") == render_page(), (
        "docs/configuration.md differs from spark_jobs/backlog/options.py; regenerate it "
        "with: .venv/bin/python -m spark_jobs.backlog.options > docs/configuration.md"
    )
