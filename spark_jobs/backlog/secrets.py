"""Keeping secrets out of messages, logs and Spark's UI.

Users hand the job secrets in three shapes: a database URL with a password, client
properties such as Kafka's ``sasl.jaas.config`` or ``ssl.key.password``, and JSON options
that nest those properties. Whatever the job echoes back (an error naming the offending
value, a log line, Spark's environment page) goes through these functions first.

Keys are judged as Spark judges them (``spark.redaction.regex``), so a value Spark would
hide is hidden here too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

#: Spark's default ``spark.redaction.regex``: a conf key (or value) matching it is hidden.
SPARK_DEFAULT_REDACTION = r"(?i)secret|password|token|access[.]?key"
#: The user-info part of a URL that carries a password: ``//user:password@``, read as
#: SQLAlchemy's ``make_url`` reads it: the user up to the first ':' (an '@' in it too), the
#: password from there up to the next '@', whatever else it holds ('/', ':').
_URL_PASSWORD = r"(//[^:/\s]*:)([^@\s]+)(@)"
#: Keys Spark's default misses: API keys and HTTP headers, as OpenLineage's transport
#: settings carry them (``spark.openlineage.transport.auth.apiKey``,
#: ``spark.openlineage.transport.headers.*``).
_API_CREDENTIALS = r"api[._-]?key|authorization|transport[.]headers"
#: What our launchers set as ``spark.redaction.regex``: Spark's default, API credentials,
#: and any value with a URL that carries a password (``spark.backlog.metrics.url``), which
#: Spark's default does not recognise.
SPARK_REDACTION_REGEX = f"{SPARK_DEFAULT_REDACTION}|{_API_CREDENTIALS}|{_URL_PASSWORD}"
REDACTED = "*****"

_SECRET_WORDS = rf"secret|password|passwd|token|access[._-]?key|credential|jaas|{_API_CREDENTIALS}"
_SECRET_KEY = re.compile(_SECRET_WORDS, re.I)
_URL_USERINFO = re.compile(_URL_PASSWORD)
#: ``"sasl.password": "..."`` in JSON that could not be parsed (so ``redact`` cannot).
_QUOTED_SECRET = re.compile(rf'("[^"]*(?:{_SECRET_WORDS})[^"]*"\s*:\s*)"(?:[^"\\]|\\.)*"', re.I)
#: ``password="..."`` inside a value, as in Kafka's ``sasl.jaas.config``, or
#: ``password='...'`` in libpq's keyword form.
_ASSIGNED_SECRET = re.compile(
    r"((?:password|secret|token)\s*=\s*)(\\?\"[^\"\\]*\\?\"|'(?:[^'\\]|\\.|'')*'|[^\s;,]+)",
    re.I,
)


def is_secret_key(key: str) -> bool:
    """Whether a setting called ``key`` holds a secret (``sasl.password``, ``ssl.key.password``,
    ``sasl.jaas.config``, ``aws.secret.access.key``...)."""
    return bool(_SECRET_KEY.search(key))


def redact_text(text: str) -> str:
    """``text`` with the password of every URL in it, quoted secret-keyed JSON values and
    ``password=...`` assignments replaced (for text that is not valid JSON)."""
    text = _URL_USERINFO.sub(rf"\g<1>{REDACTED}\g<3>", text)
    text = _QUOTED_SECRET.sub(rf'\g<1>"{REDACTED}"', text)
    return _ASSIGNED_SECRET.sub(rf"\g<1>{REDACTED}", text)


def redact(value: Any) -> Any:
    """A copy of ``value`` (mappings, lists, strings) with secret-keyed entries and URL
    passwords replaced; JSON text is redacted inside and stays JSON text."""
    if isinstance(value, Mapping):
        return {
            key: REDACTED if is_secret_key(str(key)) and item is not None else redact(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(item) for item in value]
    if isinstance(value, str):
        stripped = value.lstrip()
        if stripped[:1] in ("{", "["):
            try:
                parsed = json.loads(value)
            except (ValueError, RecursionError):
                pass
            else:
                return json.dumps(redact(parsed))
        return redact_text(value)
    return value


def redacted_repr(value: Any) -> str:
    """``repr`` of ``value`` after ``redact``: for messages that quote what the user wrote."""
    return repr(redact(value))
