"""Each system's description for :func:`lifeline.control.ettr.ettr_at_scale` (pure).

A system is what its design changes, computed from the same :class:`SharedCosts`: how long its
checkpoint stalls training and how often it runs, the bytes it copies, the tier it restores from,
how long a checkpoint takes to become restorable (``lag``) and what is recomputed after a failure.
Notation: ``T`` iteration, ``d`` one GPU's dense state, ``h``, ``n``, ``s`` the host, peer-network
and storage bandwidths of :class:`SharedCosts`; ``snap = d / h``.
"""

from __future__ import annotations

from lifeline.control._checks import integer, non_negative, positive
from lifeline.control._ettr_model import (
    SharedCosts,
    SystemCosts,
    _ceil,
    rollback_lost_seconds,
    window_rework_seconds,
)
from lifeline.errors import ConfigError


def _interval(field: str, value: int | None) -> int | None:
    return None if value is None else integer(field, value, 1)


def checkfreq(shared: SharedCosts, *, interval_iterations: int | None = None, overhead: float = 0.035) -> SystemCosts:
    """CheckFreq (Mohan et al., FAST '21, §4): dense two-phase checkpoints, restored from storage.

    ``snapshot()`` copies the state to host memory while the next iteration's forward and backward
    pass run (it must end before the next update); ``persist()`` writes it to storage in the
    background, and the next snapshot waits for it (one checkpoint in flight, §4.2). Per
    checkpoint every ``k`` iterations:
    ``C = max(0, snap - T, snap + persist - k T)`` with ``persist = d / s``; a checkpoint is
    restorable ``lag = snap + persist`` after it starts. Unless ``interval_iterations`` is given,
    ``k`` is CheckFreq's own choice (§4.3): the smallest keeping ``C <= p k T`` (``p`` =
    ``overhead``, 3.5 % in the paper): ``k = max(1, ceil((snap - T) / (p T)),
    ceil((snap + persist) / ((1 + p) T)))``. Recovery reads ``d`` back from storage and every
    rank rolls back: lost ``(k T + C) / 2 + lag``.

    Raises:
        ConfigError: ``overhead`` outside (0, 1) or ``interval_iterations`` < 1.
    """
    t, d = shared.iteration_seconds, shared.dense_bytes
    if not 0 < positive("checkfreq_overhead", overhead) < 1:
        raise ConfigError(f"checkfreq_overhead must be in (0, 1), got {overhead!r}", field="checkfreq_overhead")
    snap, persist = d / shared.host_bytes_per_second, d / shared.storage_bytes_per_second
    k = _interval("checkfreq_interval", interval_iterations) or max(
        1, _ceil((snap - t) / (overhead * t)), _ceil((snap + persist) / ((1 + overhead) * t)))
    stall = max(0.0, snap - t, snap + persist - k * t)
    return SystemCosts("CheckFreq", k, stall, d, "storage", d, "rollback",
                       rollback_lost_seconds(k * t + stall, snap + persist))


def gemini(shared: SharedCosts, *, interval_iterations: int | None = None, peer_copies: int = 1) -> SystemCosts:
    """Gemini (Wang et al., SOSP '23, §3-5): dense checkpoints to local and peer CPU memory.

    The GPU-to-host copy and the sends to ``peer_copies`` peers are pipelined in chunks and
    interleaved with training's traffic (§5), so a checkpoint is busy for
    ``busy = max(snap, c d / n)``; the snapshot must end before the next update. Per checkpoint
    every ``k`` iterations: ``C = max(0, snap - T, busy - k T)``; restorable ``lag = busy`` after it
    starts. Unless ``interval_iterations`` is given, ``k`` is Gemini's own: every iteration when the
    traffic fits, else the fewest iterations that hide it, ``k = max(1, ceil(busy / T))`` (§4).
    Recovery after a machine failure fetches ``d`` from a peer's memory; every rank rolls back:
    lost ``(k T + C) / 2 + lag``.

    Raises:
        ConfigError: ``peer_copies`` or ``interval_iterations`` < 1.
    """
    t, d = shared.iteration_seconds, shared.dense_bytes
    copies = integer("gemini_peer_copies", peer_copies, 1)
    snap = d / shared.host_bytes_per_second
    busy = max(snap, copies * d / shared.network_bytes_per_second)
    k = _interval("gemini_interval", interval_iterations) or max(1, _ceil(busy / t))
    stall = max(0.0, snap - t, busy - k * t)
    return SystemCosts("Gemini", k, stall, d, "peer", d, "rollback", rollback_lost_seconds(k * t + stall, busy))


def moevement_window(shared: SharedCosts, *, frozen_fraction: float, max_window: int = 64) -> tuple[int, float]:
    """MoEvement's window W and its bytes per iteration, from the same budget (§4, Algorithm 1).

    A slot holds ``1 / W`` of the operators whole (ACTIVE: weights + optimizer state) and the
    compute weights of the others (FROZEN, ``frozen_fraction`` of a whole operator's bytes):
    ``b(W) = d (1 / W + (1 - 1 / W) f)``. W is the smallest whose slot's copy to host and send to
    a peer both fit one iteration (``max(b / h, b / n) <= T``), at most ``max_window``.

    Returns:
        ``(W, b(W))``: the window, iterations; bytes one GPU copies per iteration.

    Raises:
        ConfigError: ``frozen_fraction`` outside [0, 1) or ``max_window`` < 1.
    """
    f = non_negative("frozen_fraction", frozen_fraction)
    if f >= 1:
        raise ConfigError(f"frozen_fraction must be in [0, 1), got {frozen_fraction!r}", field="frozen_fraction")
    d, t = shared.dense_bytes, shared.iteration_seconds
    slowest = min(shared.host_bytes_per_second, shared.network_bytes_per_second)
    for w in range(1, integer("max_window", max_window, 1) + 1):
        b = d * (1 / w + (1 - 1 / w) * f)
        if b / slowest <= t:
            return w, b
    return max_window, d * (1 / max_window + (1 - 1 / max_window) * f)


def moevement(shared: SharedCosts, *, window: int, sparse_bytes: float) -> SystemCosts:
    """MoEvement (Gandhi and Kozyrakis, NSDI '26, arXiv 2412.15411, §4-5): sparse checkpoints,
    upstream logging, localized replay.

    Every iteration one slot of ``b = sparse_bytes`` is copied to host memory and sent to a peer,
    overlapped with the next iteration: ``busy = max(b / h, b / n)``, ``C = max(0, busy - T)``,
    restorable ``lag = busy`` later. Recovery fetches the failed stage's latest complete window
    (``W b`` bytes) from the peer; only that stage replays, from its neighbours' logged
    activations and gradients, while the survivors wait: lost ``(1.5 W - 1)(T + C) + lag``
    (:func:`window_rework_seconds`), replayed at ``shared.replay_pace``.

    Raises:
        ConfigError: ``window`` < 1 or a non-positive ``sparse_bytes``.
    """
    w, b, t = integer("window", window, 1), positive("sparse_bytes", sparse_bytes), shared.iteration_seconds
    busy = max(b / shared.host_bytes_per_second, b / shared.network_bytes_per_second)
    stall = max(0.0, busy - t)
    return SystemCosts("MoEvement", 1, stall, b, "peer", w * b, "replay", window_rework_seconds(w, t + stall, busy))


def lifeline_costs(shared: SharedCosts, *, stall_seconds: float, window: int = 1, sparse_bytes: float | None = None,
                   name: str = "Lifeline") -> SystemCosts:
    """Lifeline from its measured stall: a checkpoint every iteration, localized replay.

    The trainer's one memcpy into the sidecar's arena stalls it ``stall_seconds`` (measured: the
    copy + any backpressure wait); the sidecar replicates the copy to a peer (L1) in the
    background, restorable ``lag = bytes / n`` later. Dense (``window = 1``, no ``sparse_bytes``):
    ``d`` bytes per iteration; sparse: ``sparse_bytes`` per iteration in a window of ``window``.
    Recovery after a node loss reads the stage's copy (``W x bytes``) from the peer; only the
    failed stage replays from upstream logs (the survivors wait): lost
    ``(1.5 W - 1)(T + C) + lag`` (:func:`window_rework_seconds`), replayed at
    ``shared.replay_pace``.

    Raises:
        ConfigError: a negative stall, ``window`` < 1, or a non-positive ``sparse_bytes``.
    """
    c, w, t = non_negative("stall_seconds", stall_seconds), integer("window", window, 1), shared.iteration_seconds
    b = shared.dense_bytes if sparse_bytes is None else positive("sparse_bytes", sparse_bytes)
    lag = b / shared.network_bytes_per_second
    return SystemCosts(name, 1, c, b, "peer", w * b, "replay", window_rework_seconds(w, t + c, lag))


def modeled_peers(shared: SharedCosts, *, window: int, sparse_bytes: float, checkfreq_interval: int | None = None,
                  gemini_interval: int | None = None, checkfreq_overhead: float = 0.035,
                  gemini_peer_copies: int = 1) -> tuple[SystemCosts, SystemCosts, SystemCosts]:
    """``(CheckFreq, Gemini, MoEvement)`` under ``shared`` (:func:`checkfreq`, :func:`gemini`,
    :func:`moevement`); intervals ``None`` let CheckFreq and Gemini choose their own."""
    return (checkfreq(shared, interval_iterations=checkfreq_interval, overhead=checkfreq_overhead),
            gemini(shared, interval_iterations=gemini_interval, peer_copies=gemini_peer_copies),
            moevement(shared, window=window, sparse_bytes=sparse_bytes))
