"""Staging device tensors to host memory: pinned buffers, a side stream and a ready event.

The arena and the sidecar's socket take host bytes. A tensor on an accelerator (CUDA) is copied
into a reusable page-locked host buffer on a side stream that first waits for the producing
stream, and an event marks the copy done: the trainer's thread only launches the copy;
:meth:`HostStager.ready` blocks the host until the bytes are there (before they are read), and
:meth:`HostStager.hold_updates` makes the current stream wait on the event, so the next kernel that
writes the tensor (the optimizer update) cannot overtake the copy. On a CPU tensor it is the plain
path: the tensor itself (contiguous), no copy, no stream. The code is device-agnostic: another
device type is copied synchronously into an ordinary host buffer.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import Tensor

__all__ = ["HostStager", "host_bytes"]


class HostStager:
    """Copies device tensors into reusable host buffers (pinned when CUDA is available).

    Args:
        keep: how many host buffers (one per key, dtype and shape) are kept for reuse, least recently
            used dropped first; ``None``: all.
    """

    def __init__(self, keep: int | None = 8) -> None:
        self.keep = keep
        self._buffers: OrderedDict[tuple[Any, torch.dtype, tuple[int, ...]], Tensor] = OrderedDict()
        self._streams: dict[Any, Any] = {}
        self._event: Any = None

    def _buffer(self, tensor: Tensor, key: Any) -> Tensor:
        full = (key, tensor.dtype, tuple(tensor.shape))
        buf = self._buffers.pop(full, None)
        if buf is None:
            buf = torch.empty(full[2], dtype=full[1], pin_memory=torch.cuda.is_available())
        self._buffers[full] = buf
        while self.keep is not None and len(self._buffers) > self.keep:
            self._buffers.popitem(last=False)
        return buf

    def stage(self, tensor: Tensor, key: Any = None) -> Tensor:
        """A host tensor with ``tensor``'s values (same dtype and shape): ``tensor`` itself, contiguous,
        when it is on the CPU; else a reused host buffer the copy is launched into (asynchronously on
        CUDA: call :meth:`ready` before reading it). A buffer is reused by the next ``stage`` of the same
        ``key`` (e.g. the entry's name), dtype and shape: read it before then."""
        if tensor.device.type == "cpu":
            return tensor.contiguous()
        buf = self._buffer(tensor, key)
        if tensor.device.type == "cuda":
            stream = self._streams.get(tensor.device)
            if stream is None:
                stream = self._streams[tensor.device] = torch.cuda.Stream(device=tensor.device)
            stream.wait_stream(torch.cuda.current_stream(tensor.device))  # the values the producer wrote
            with torch.cuda.stream(stream):
                buf.copy_(tensor, non_blocking=True)
                tensor.record_stream(stream)  # its memory is not reused before the copy ran
                self._event = torch.cuda.Event()
                self._event.record(stream)
        else:
            buf.copy_(tensor)
        return buf

    def ready(self) -> None:
        """Block the host until every copy launched so far is done (no-op when none is in flight)."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None

    def hold_updates(self) -> None:
        """Make the current CUDA stream wait for the copies in flight: call it before an optimizer update
        that writes the staged tensors (no-op on the CPU path)."""
        if self._event is not None:
            torch.cuda.current_stream().wait_event(self._event)


def host_bytes(data: Any, stager: HostStager | None = None) -> memoryview:
    """The raw bytes of ``data`` (a tensor on any device, or bytes-like) as a memoryview.

    A CPU tensor is viewed in place (made contiguous first); a device tensor is staged to host memory
    through ``stager`` (a new one by default) and waited for.

    Raises:
        TypeError: ``data`` is neither a tensor nor bytes-like.
    """
    if isinstance(data, Tensor):
        stager = stager if stager is not None else HostStager(keep=1)
        host = stager.stage(data.detach())
        stager.ready()
        if host.numel() == 0:
            return memoryview(b"")
        return memoryview(host.reshape(-1).view(torch.uint8).numpy())
    return memoryview(data).cast("B")
