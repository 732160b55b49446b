"""Structured (JSON lines) logs for the sidecar process."""

from __future__ import annotations

import json
import logging
import sys
import time

_STD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, job, rank and any ``extra`` fields."""

    def __init__(self, **static) -> None:
        super().__init__()
        self.static = static

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
               "level": record.levelname, "logger": record.name, "message": record.getMessage(), **self.static}
        out.update({k: v for k, v in vars(record).items() if k not in _STD and not k.startswith("_")})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str, **static) -> None:
    """Send the ``lifeline`` loggers to stderr as JSON lines with ``static`` fields (job, rank)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(**static))
    root = logging.getLogger("lifeline")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
