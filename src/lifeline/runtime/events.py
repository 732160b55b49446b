"""Reading back the JSON event lines a trainer prints (``RuntimeContext.report``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

__all__ = ["read_events"]


def read_events(logs: Iterable[Path]) -> list[dict]:
    """Every JSON event line of ``logs``, in the order given, each file's lines in order.

    A trainer's log interleaves these lines (``{"event": ..., "rank": ..., "time": ...}``) with
    other output; lines that do not start with ``{`` or are not valid JSON (a line cut short by
    a kill) are skipped. Undecodable bytes are replaced, never raised.
    """
    out = []
    for log in logs:
        for line in Path(log).read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return out
