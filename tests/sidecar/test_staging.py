"""Staging tensors to host bytes for the arena and the sidecar socket (``lifeline.sidecar.client._staging``).

The CPU path runs everywhere; the CUDA path (pinned buffer, side stream, event) is
``tests/gpu/test_staging_cuda.py``, collected only where a GPU is (``scripts/gpu_check.sh`` runs it)."""

from __future__ import annotations

import pytest
import torch

from lifeline.sidecar.client._staging import HostStager, host_bytes


def test_a_cpu_tensor_is_its_own_host_copy_and_its_bytes_are_its_values():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    stager = HostStager()
    assert stager.stage(t) is t  # contiguous on the CPU: no copy, no stream
    strided = t.t()  # non-contiguous: made contiguous, values in C order of the view
    assert bytes(host_bytes(strided)) == strided.contiguous().numpy().tobytes()
    assert bytes(host_bytes(torch.empty(0, 5))) == b""
    assert bytes(host_bytes(b"abc")) == b"abc"
    stager.ready()
    stager.hold_updates()  # nothing in flight: no-ops


def test_a_value_that_is_neither_tensor_nor_bytes_is_refused():
    with pytest.raises(TypeError):
        host_bytes(3.5)
