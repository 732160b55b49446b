"""Invariant 2 (resharding), as property tests: save in A, load in B, consolidate -> bit-identical.

Runs against the filesystem and the real MinIO server.
"""

from __future__ import annotations

import uuid

import pytest
import torch
from ckpt_models import assert_states_equal, model_and_layouts, pipeline_split, states_for
from hypothesis import HealthCheck, given, settings

from lifeline.checkpoint import FilesystemStorage, S3Storage, consolidate, list_steps, load, save_states

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
                derandomize=True)


def _roundtrip(storage, prefix: str, model, a, b) -> None:
    job = f"j{uuid.uuid4().hex[:8]}"
    states_a = states_for(model, a)
    for r, s in enumerate(states_a):
        s["rng"] = f"rank-{r}-rng".encode()
    save_states(storage, prefix, job, 10, a, model.rules, states_a)
    assert list_steps(storage, prefix, job) == [10]

    # consolidated straight from A
    full_a = consolidate(storage, prefix, job, 10)
    assert_states_equal(full_a, model.full)

    # load every rank of B, compare with the direct cut of the full state
    states_b = []
    for r in range(b.world_size):
        want = pipeline_split(model.state(b, r), b, r)
        into = {k: torch.full_like(v, 0) if v.dtype != torch.bool else torch.zeros_like(v) for k, v in want.items()}
        into["rng"] = None
        report = load(storage, prefix, job, 10, b, r, model.rules, into)
        assert into.pop("rng") == (f"rank-{r}-rng".encode() if r < a.world_size else b"rank-0-rng")
        assert report.fallbacks == []
        assert_states_equal(into, want)
        states_b.append(into)

    # save in B, consolidate: bit-identical to the consolidated original
    save_states(storage, prefix, job, 11, b, model.rules, states_b)
    assert_states_equal(consolidate(storage, prefix, job, 11), full_a)


@settings(max_examples=80, **SETTINGS)
@given(case=model_and_layouts())
def test_reshard_filesystem(tmp_path_factory, case):
    model, a, b = case
    storage = FilesystemStorage(tmp_path_factory.mktemp("fs"), fsync=False)
    _roundtrip(storage, "ckpt", model, a, b)


@pytest.fixture(scope="module")
def s3(minio_server):
    return S3Storage(minio_server.endpoint, minio_server.access_key, minio_server.secret_key,
                     f"reshard-{uuid.uuid4().hex[:8]}", secure=False)


@settings(max_examples=30, **SETTINGS)
@given(case=model_and_layouts())
def test_reshard_minio(s3, case):
    model, a, b = case
    _roundtrip(s3, "ckpt", model, a, b)
