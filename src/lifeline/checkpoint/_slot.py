"""One slot of a sparse window (MoEvement §4): which operators a step captured, and its bytes.

A sparse checkpoint is a **window** of W consecutive steps ``start .. start + W - 1``
(``start`` a multiple of W). At step ``start + i`` (slot ``i``) a rank captures the operators
of slot ``i`` ACTIVE (weights and optimizer state), every operator of a later slot FROZEN
(compute weights only) and every byte entry (data position, RNG); operators of earlier slots
are not captured. A window is restorable once all W slots of every rank of a stage are held.

A slot's bytes are self-describing, in the universal format::

    b"LLSLOT1\\n" | u64 little-endian header length | header JSON | blob

The header holds the :class:`SlotRecord` (the window's manifest entry for this step) and the
blob's sealed :class:`~lifeline.checkpoint.ShardMetadata` (crc32c per chunk); the blob is
written by :func:`~lifeline.checkpoint.write_shard` from the slot's entries.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch

from lifeline.checkpoint._blob import read_shard
from lifeline.checkpoint._layout import Layout
from lifeline.checkpoint._shard_metadata import ShardMetadata, seal_shard
from lifeline.checkpoint._shard_plan import dtype_from_name, plan_shard, write_shard
from lifeline.checkpoint._rules import PatternRules
from lifeline.errors import ChecksumError, ConfigError, ManifestError

__all__ = ["OperatorMembers", "SlotRecord", "pack_slot", "slot_entries", "slot_record", "unpack_slot"]

_MAGIC = b"LLSLOT1\n"
_LEN = struct.Struct("<Q")


@dataclass(frozen=True)
class OperatorMembers:
    """The state entries of one operator: ``weights`` (its compute weights, captured FROZEN and
    ACTIVE) and ``optimizer`` (its optimizer state, captured ACTIVE only). Fully qualified names."""

    weights: tuple[str, ...]
    optimizer: tuple[str, ...]


@dataclass(frozen=True)
class SlotRecord:
    """The window manifest's entry for one step.

    Attributes:
        start: the window's first step (a multiple of ``window``), completed steps.
        window: W, steps per window (>= 1).
        index: this slot, ``0 <= index < window``; the step captured is ``start + index``.
        active: operators captured ACTIVE at this step (weights + optimizer state).
        frozen: operators captured FROZEN (weights only): those of the window's later slots.
        plan: the window's whole schedule, ``plan[i]`` the operators ACTIVE at slot ``i`` (empty:
            not recorded). Every slot carries it, so a trainer that restarts inside a window goes on
            capturing with the same schedule (its slots then compose with the earlier ones).

    Raises:
        ConfigError: ``window`` < 1, ``index`` outside the window, ``start`` not a multiple of
            ``window``, or an operator both active and frozen.
    """

    start: int
    window: int
    index: int
    active: tuple[str, ...]
    frozen: tuple[str, ...]
    plan: tuple[tuple[str, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.plan and (len(self.plan) != self.window or tuple(self.plan[self.index]) != tuple(self.active)
                          or tuple(n for p in self.plan[self.index + 1:] for n in p) != tuple(self.frozen)):
            raise ConfigError(f"slot {self.index}'s active and frozen operators do not match the window's plan",
                              field="plan")
        if self.window < 1 or not 0 <= self.index < self.window or self.start < 0 or self.start % self.window:
            raise ConfigError(f"slot {self.index} of a window of {self.window} starting at step {self.start}: the "
                              "window must be >= 1, the slot inside it and the start a multiple of it", field="window")
        if set(self.active) & set(self.frozen):
            raise ConfigError(f"operators {sorted(set(self.active) & set(self.frozen))} are both active and frozen",
                              field="active")

    @property
    def step(self) -> int:
        """The step this slot captured (``start + index``)."""
        return self.start + self.index

    def to_dict(self) -> dict[str, Any]:
        out = {"start": self.start, "window": self.window, "index": self.index, "active": list(self.active),
               "frozen": list(self.frozen)}
        if self.plan:
            out["plan"] = [list(p) for p in self.plan]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SlotRecord:
        """Inverse of :meth:`to_dict`; :class:`ManifestError` when malformed."""
        try:
            return cls(int(d["start"]), int(d["window"]), int(d["index"]), tuple(d["active"]), tuple(d["frozen"]),
                       tuple(tuple(p) for p in d.get("plan", ())))
        except (KeyError, TypeError, ValueError) as err:
            raise ManifestError(f"malformed slot record: {err!r}") from err


def slot_entries(state: Mapping[str, Any], record: SlotRecord, members: Mapping[str, OperatorMembers], *,
                 compute_dtype: torch.dtype | None = None) -> dict[str, Any]:
    """The entries of ``state`` slot ``record`` captures: every entry of its ACTIVE operators, the
    weights of its FROZEN ones and every byte entry (data position, RNG). ACTIVE tensors are not
    copied; FROZEN weights are their compute weights: cast to ``compute_dtype`` when it is a
    floating dtype narrower than theirs (bfloat16 masters of fp32 weights: 2 bytes per parameter,
    MoEvement §4; exact when the forward pass uses them so rounded), else not copied either.

    Raises:
        ConfigError: an operator of ``record`` missing from ``members``, or a member missing
            from ``state``.
    """
    names: list[str] = []
    for op in record.active:
        m = _members(members, op)
        names += [*m.weights, *m.optimizer]
    frozen: set[str] = set()
    for op in record.frozen:
        frozen.update(_members(members, op).weights)
    names += sorted(frozen)
    out = {}
    for n in names:
        if n not in state:
            raise ConfigError(f"operator member {n!r} is not in the state", field="members")
        out[n] = _compute_weight(state[n], compute_dtype) if n in frozen else state[n]
    out.update((k, v) for k, v in state.items() if not isinstance(v, torch.Tensor))
    return out


def _narrower(dtype: torch.dtype | None, t: Any) -> bool:
    """Whether ``dtype`` is a floating dtype narrower than floating tensor ``t``'s (bf16 of fp32)."""
    return (dtype is not None and isinstance(t, torch.Tensor) and t.is_floating_point() and dtype.is_floating_point
            and torch.finfo(dtype).bits < torch.finfo(t.dtype).bits)


def _compute_weight(t: Any, dtype: torch.dtype | None) -> Any:
    """``t`` in ``dtype`` when that is a narrower floating dtype (round to nearest even), else ``t``."""
    return t.detach().to(dtype) if _narrower(dtype, t) else t


def _members(members: Mapping[str, OperatorMembers], op: str) -> OperatorMembers:
    try:
        return members[op]
    except KeyError:
        raise ConfigError(f"no operator named {op!r} in this stage", field="members") from None


def pack_slot(entries: Mapping[str, Any], record: SlotRecord, *, job: str, layout: Layout, rank: int,
              rules: PatternRules) -> bytearray:
    """Serialize a slot's entries (from :func:`slot_entries`): header + universal-format blob.

    Returns the bytes (see the module docstring); size = 16 + header + the blob's bytes.

    Raises:
        LayoutError: an entry the layout's patterns cannot place.
    """
    plan = plan_shard(entries, layout, rank, rules)
    blob = bytearray(plan.nbytes)
    write_shard(plan, entries, blob)
    meta = seal_shard(plan, blob, job=job, step=record.step)
    header = json.dumps({"slot": record.to_dict(), "meta": meta.to_dict()}, separators=(",", ":")).encode()
    return bytearray(_MAGIC + _LEN.pack(len(header)) + header) + blob


def unpack_slot(data: Any, into: MutableMapping[str, Any], *, layout: Layout, rank: int, rules: PatternRules
                ) -> SlotRecord:
    """Verify a packed slot (every chunk's crc32c) and copy its entries into ``into`` in place.

    Only the slot's entries are written; ``into`` must hold each of them with the saved shape,
    and with the saved dtype or a wider floating one (FROZEN compute weights stored in bfloat16 are
    widened exactly into fp32 weights); byte entries are replaced. Returns the slot's :class:`SlotRecord`.

    Raises:
        ManifestError: not a slot (bad magic or header).
        ChecksumError: a chunk or byte entry does not match its checksum.
        LayoutError: ``into`` lacks an entry or has another shape or dtype.
    """
    view = memoryview(data).cast("B")
    record, stored, body = _header(view)
    blob = view[body:]
    if len(blob) != stored.nbytes:
        raise ChecksumError(f"slot of step {record.step} has {len(blob)} blob bytes, its metadata {stored.nbytes}",
                            rank=rank, step=record.step)
    for t in stored.tensors:
        for c in t.chunks:
            c.verify(blob[c.byte_offset : c.byte_offset + c.byte_length], 0, name=t.fqn, rank=rank)
    for b in stored.bytes_entries:
        b.verify(blob[b.byte_offset : b.byte_offset + b.byte_length], rank=rank)
    names = [t.fqn for t in stored.tensors]
    missing = [n for n in names if n not in into]
    if missing:
        raise ConfigError(f"the state to restore into lacks {missing[:3]} of slot {record.index}", field="into")
    target = {t.fqn: _staging(into[t.fqn], t.dtype) for t in stored.tensors}
    target.update({b.key: into.get(b.key, b"") for b in stored.bytes_entries})
    read_shard(plan_shard(target, layout, rank, rules), stored, blob, target)
    for k, v in target.items():
        if not isinstance(v, torch.Tensor):
            into[k] = v
        elif v is not into[k]:  # a narrower compute weight, widened (exact)
            with torch.no_grad():
                into[k].copy_(v)
    return record


def _staging(dst: Any, saved: str) -> Any:
    """Where a saved tensor of dtype name ``saved`` is read before it reaches ``dst``: ``dst`` itself,
    or ``dst`` rounded to the saved dtype when that is a narrower floating one (a FROZEN compute
    weight; the elements no chunk holds, a ``Padded`` tensor's zero rows, round to themselves)."""
    dtype = dtype_from_name(saved)
    return dst.detach().to(dtype) if _narrower(dtype, dst) else dst  # else same dtype, or a mismatch read_shard reports



def slot_record(data: Any) -> SlotRecord:
    """The :class:`SlotRecord` in a packed slot's header (nothing else is read or verified).

    Raises:
        ManifestError: not a slot (bad magic or header).
    """
    return _header(memoryview(data).cast("B"))[0]


def _header(view: memoryview) -> tuple[SlotRecord, ShardMetadata, int]:
    """``(record, blob metadata, offset of the blob)`` of a packed slot."""
    if len(view) < len(_MAGIC) + _LEN.size or bytes(view[: len(_MAGIC)]) != _MAGIC:
        raise ManifestError("not a sparse-checkpoint slot (bad magic)")
    (n,) = _LEN.unpack_from(view, len(_MAGIC))
    body = len(_MAGIC) + _LEN.size + n
    try:
        header = json.loads(bytes(view[len(_MAGIC) + _LEN.size : body]))
        return SlotRecord.from_dict(header["slot"]), ShardMetadata.from_dict(header["meta"]), body
    except (ValueError, KeyError, TypeError) as err:
        raise ManifestError(f"malformed slot header: {err!r}") from err
