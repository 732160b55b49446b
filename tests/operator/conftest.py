"""Fixtures of the operator's unit tests: a validated TrainingJob as read from the API server."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from lifeline.api.load import load_trainingjob

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt-moe.yaml"


@pytest.fixture
def job_body() -> dict:
    """examples/gpt-moe.yaml with the metadata the API server adds (uid, namespace, generation)."""
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"].update(uid="0b7f5c4e-1111-2222-3333-444455556666", namespace="team-a", generation=1)
    return body


@pytest.fixture
def job(job_body):
    """The validated :class:`~lifeline.api.TrainingJob` of :func:`job_body`."""
    return load_trainingjob(copy.deepcopy(job_body))
