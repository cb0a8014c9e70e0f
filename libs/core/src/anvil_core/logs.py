"""Structured logging: one JSON object per line on stderr, so the launcher's per-service log files
and `docker logs` read the same. Secrets never reach a log line: callers log redacted URLs."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

__all__ = ["get_logger", "setup_logging"]

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None)))


class _JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(time.time(), 6),
            "level": record.levelname.lower(),
            "service": self._service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup_logging(service: str, level: str = "INFO") -> None:
    """Configure the root logger once per process (idempotent)."""
    root = logging.getLogger()
    root.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter(service))
    root.addHandler(handler)
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access",):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
