"""Fixtures of the control tests that talk to a real Redis."""

from __future__ import annotations

import uuid

import pytest

from lifeline.catalog import Catalog


@pytest.fixture
def catalog(redis_server):
    """A 4-rank job's catalog on the session's real Redis (a fresh job name), wiped afterwards."""
    cat = Catalog(redis_server.url, f"ctl-{uuid.uuid4().hex[:6]}", 4)
    try:
        yield cat
    finally:
        cat.wipe()
        cat.close()
