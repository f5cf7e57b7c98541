import json
import re

import pytest
from sqlalchemy.engine import make_url

from spark_jobs.backlog.secrets import (
    REDACTED,
    SPARK_REDACTION_REGEX,
    is_secret_key,
    redact,
    redact_text,
    redacted_repr,
)


@pytest.mark.parametrize(
    "key",
    ["kafka.sasl.password", "ssl.key.password", "sasl.jaas.config", "aws.secret.access.key"],
)
def test_keys_that_hold_secrets_are_recognised(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["kafka.bootstrap.servers", "path", "name", "subscribe"])
def test_ordinary_keys_are_not(key):
    assert not is_secret_key(key)


def test_a_url_keeps_everything_but_its_password():
    assert redact_text("postgresql://metrics:s3cret@db:5432/m") == (
        f"postgresql://metrics:{REDACTED}@db:5432/m"
    )
    assert redact_text("sqlite:////data/metrics.db") == "sqlite:////data/metrics.db"


def test_nested_options_are_redacted_by_key_and_json_text_stays_json():
    sources = json.dumps(
        [{"name": "kafka", "kind": "kafka", "kafka.sasl.password": "hunter2", "path": "/x"}]
    )
    shown = redact(sources)
    assert "hunter2" not in shown
    assert json.loads(shown)[0] == {
        "name": "kafka",
        "kind": "kafka",
        "kafka.sasl.password": REDACTED,
        "path": "/x",
    }


def test_text_that_is_not_valid_json_still_loses_its_secrets():
    broken = '[{"name": "k", "kafka.sasl.password": "hunter2", "path": '
    jaas = 'PlainLoginModule required username="u" password="hunter2";'
    assert "hunter2" not in redact_text(broken)
    assert "hunter2" not in redact_text(jaas) and 'username="u"' in redact_text(jaas)
    assert "hunter2" not in redacted_repr({"sasl.jaas.config": jaas})


def test_sparks_redaction_regex_hides_our_metrics_url_and_what_spark_hides():
    pattern = re.compile(SPARK_REDACTION_REGEX)
    assert pattern.search("postgresql://metrics:s3cret@db/m")
    assert pattern.search("spark.hadoop.fs.s3a.secret.key")
    assert not pattern.search("sqlite:////data/metrics.db")


@pytest.mark.parametrize(
    "key",
    [
        "spark.openlineage.transport.auth.apiKey",
        "spark.openlineage.transport.headers.X-Team",
        "spark.openlineage.transport.headers.Authorization",
    ],
)
def test_openlineage_transport_credentials_are_hidden_from_spark_and_our_messages(key):
    assert re.search(SPARK_REDACTION_REGEX, key)
    assert is_secret_key(key)
    assert redact({key: "Bearer abc123"}) == {key: REDACTED}
    assert not re.search(SPARK_REDACTION_REGEX, "spark.openlineage.transport.url")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:pa/ss@h/db", f"postgresql://u:{REDACTED}@h/db"),
        ("postgresql://u:p:a/s?s#@h:5432/db", f"postgresql://u:{REDACTED}@h:5432/db"),
        # A user name holding '@', as some hosted servers ask for: make_url reads it so.
        ("postgresql://reader@server:pa/ss@h/db", f"postgresql://reader@server:{REDACTED}@h/db"),
    ],
)
def test_a_password_is_hidden_wherever_sqlalchemy_finds_one(url, shown):
    assert make_url(url).password is not None
    assert make_url(url).password not in shown
    assert redact_text(url) == shown
    assert redact_text(f"cannot connect to {url}: refused") == f"cannot connect to {shown}: refused"
    assert re.search(SPARK_REDACTION_REGEX, url)


@pytest.mark.parametrize(
    "url", ["postgresql://u@h:5432/db", "postgresql://h/db", "sqlite:////data/m.db"]
)
def test_a_url_without_a_password_is_left_as_it_is(url):
    assert make_url(url).password is None
    assert redact_text(url) == url
    assert not re.search(SPARK_REDACTION_REGEX, url)


def test_a_password_in_single_quotes_is_hidden_whole():
    """libpq's keyword form quotes a value with spaces in single quotes."""
    shown = redact_text("host=db user=me password='my secret pw' dbname=shop")
    assert "secret" not in shown and "pw" not in shown.split("dbname")[0].split("password")[1]
    assert shown.endswith("dbname=shop")
