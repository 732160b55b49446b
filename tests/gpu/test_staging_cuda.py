"""The CUDA path of ``lifeline.sidecar.client._staging``: a pinned host buffer, a side stream and an event the
next update waits on. Collected only where PyTorch sees a CUDA device (``tests/conftest.py``'s
``collect_ignore``: never a skip, which CI counts as a failure); ``scripts/gpu_check.sh`` runs it."""

from __future__ import annotations

import torch

from lifeline.sidecar.client._staging import HostStager, host_bytes


def test_a_cuda_tensor_is_staged_through_a_reused_pinned_buffer_and_the_update_waits_for_it():
    stager = HostStager(keep=1)
    t = torch.randn(1024, 256, device="cuda")
    before = t.clone()
    host = stager.stage(t)
    assert host.device.type == "cpu" and host.is_pinned()
    stager.hold_updates()
    t.add_(1.0)  # queued behind the copy on the current stream
    stager.ready()
    assert torch.equal(host, before.cpu())
    assert stager.stage(t) is host  # same dtype and shape: the buffer is reused
    stager.ready()
    assert bytes(host_bytes(t)) == t.cpu().numpy().tobytes()
