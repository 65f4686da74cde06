"""``--log-format json``: one JSON object per log line, for log shippers.

Every line carries ``time``, ``level``, ``logger`` and ``message`` (the text
line, word for word). The driver's batch and range lines also carry their
numbers as fields: it logs them with ``extra={"fields": {...}}``
(:func:`fields`), which the text format ignores and this one merges in.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

TEXT = "text"
JSON = "json"
LOG_FORMATS = (TEXT, JSON)
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def fields(**values: Any) -> dict[str, Mapping[str, Any]]:
    """``extra=`` for a log call whose numbers the JSON format should carry as fields."""
    return {"fields": values}


class JsonFormatter(logging.Formatter):
    """A record as one JSON object: time, level, logger, message, and the record's ``fields``."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        extra = getattr(record, "fields", None)
        if isinstance(extra, Mapping):
            line.update(extra)
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == JSON else logging.Formatter(TEXT_FORMAT)
