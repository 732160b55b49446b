"""The GPT-MoE model configuration (one frozen dataclass, validated against a layout)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from lifeline.checkpoint import Layout
from lifeline.errors import ConfigError, LayoutError

__all__ = ["GPTMoEConfig", "EOD_TOKEN", "BYTE_VOCAB", "COMPUTE_DTYPES", "SCHEDULES"]

BYTE_VOCAB = 256
"""Byte-level tokens ``0..255``."""
EOD_TOKEN = 256
"""The end-of-document token appended after every source file (logical vocabulary 257)."""
SCHEDULES = ("gpipe", "1f1b")
"""The pipeline schedules :attr:`GPTMoEConfig.schedule` takes."""
COMPUTE_DTYPES = ("float32", "bfloat16")
"""The dtypes :attr:`GPTMoEConfig.compute_dtype` takes."""


@dataclass(frozen=True)
class GPTMoEConfig:
    """Shape and training hyper-parameters of the reference GPT-MoE trainer.

    Defaults train in seconds per dozen steps on 2 CPU cores. Units: sizes in elements,
    ``corpus_bytes`` in bytes, ``lr`` per optimizer step.

    * ``vocab_size`` — logical vocabulary: 256 bytes + the end-of-document token = 257. The
      embedding and output layer are padded to a multiple of ``vocab_multiple`` rows
      (:attr:`padded_vocab`), exercising the ``Padded`` checkpoint pattern; padding rows are
      zero and stay zero (no token uses them, their gradients are zero).
    * ``d_model``, ``n_layers``, ``n_heads`` — the decoder; ``positions`` is ``"rope"`` (RoPE,
      Su et al. 2021) or ``"learned"`` (absolute embeddings, GPT-2).
    * ``n_experts``, ``top_k``, ``d_expert`` — MoE feed-forward layers of SwiGLU experts
      (Shazeer 2020), top-k gating, dropless (every routed token is computed);
      ``shared_expert`` adds one always-active dense SwiGLU (DeepSeekMoE, Dai et al. 2024 §3.2).
    * ``aux_loss_coef`` — weight α of the Switch Transformer load-balancing loss
      (Fedus et al. 2021, §2.2, eq. 4).
    * ``micro_batch``, ``micro_batches`` — sequences per micro-batch and micro-batches per step
      per replica group.
    * ``schedule`` — the pipeline schedule: ``"gpipe"`` (Huang et al. 2019: every forward, then
      every backward) or ``"1f1b"`` (PipeDream-Flush, Narayanan et al. 2021 §2.2: warm-up forwards,
      one forward one backward, cool-down backwards; at most ``stages - stage`` micro-batches'
      activations held per stage). Both accumulate gradients in micro-batch order, so a run is
      bit-identical under either (:mod:`~lifeline.models.gpt_moe._pipeline`).
    * ``seq_len`` — tokens per sequence; ``corpus_bytes`` — bytes of the standard-library corpus read.
    * ``lr``, ``betas``, ``eps``, ``weight_decay`` — AdamW (Loshchilov & Hutter 2019).
    * ``warmup_steps``, ``decay_steps``, ``min_lr_ratio`` — linear warm-up to ``lr``, then cosine
      decay to ``lr * min_lr_ratio`` at ``decay_steps`` (steps).
    * ``grad_clip`` — global gradient-norm clipping across every rank (0: off).
    * ``zero1`` — ZeRO-1 (Rajbhandari et al. 2020, §5.1 ``P_os``): each data-parallel rank keeps
      and updates the AdamW moments of its partition of every parameter only, then the
      parameters are all-gathered (bit-identical to ``False``; checkpoints store the moments with
      the ``Zero1`` pattern and reshard to any layout, with or without ZeRO-1).
    * ``compute_dtype`` — the dtype the forward and backward passes use the parameters in:
      ``"float32"`` or ``"bfloat16"`` (fp32 masters updated by AdamW, each parameter used rounded
      to bfloat16: :mod:`~lifeline.models.gpt_moe._precision`). Sparse checkpoints store FROZEN
      operators in it (2 bytes per parameter for bfloat16, MoEvement §4).
    * ``seed`` — parameter initialisation (per tensor, layout-independent), data order, RNG per rank.
    """

    vocab_size: int = BYTE_VOCAB + 1
    vocab_multiple: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    positions: Literal["rope", "learned"] = "rope"
    n_experts: int = 4
    top_k: int = 2
    d_expert: int = 128
    shared_expert: bool = True
    aux_loss_coef: float = 0.01
    seq_len: int = 64
    micro_batch: int = 4
    micro_batches: int = 2
    schedule: Literal["gpipe", "1f1b"] = "gpipe"
    corpus_bytes: int = 1 << 20
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.01
    warmup_steps: int = 4
    decay_steps: int = 200
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    zero1: bool = False
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    init_std: float = 0.02
    seed: int = 1234

    @property
    def padded_vocab(self) -> int:
        """Rows of the embedding/output layer: ``vocab_size`` rounded up to ``vocab_multiple``."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @property
    def tokens_per_step(self) -> int:
        """Tokens one replica group trains on per step: ``micro_batch * micro_batches * seq_len``."""
        return self.micro_batch * self.micro_batches * self.seq_len

    def validate(self, layout: Layout | None = None) -> GPTMoEConfig:
        """Check the configuration (and its fit to ``layout``); returns ``self``.

        Raises:
            ConfigError: a field out of range (``field`` names it).
            LayoutError: a layout this trainer cannot take; ``key`` is ``layout.<degree>`` and the
                message names the model field and both sizes (see :meth:`_validate_layout`).
        """
        positive = ("vocab_size", "vocab_multiple", "d_model", "n_layers", "n_heads", "n_experts", "top_k",
                    "d_expert", "seq_len", "micro_batch", "micro_batches", "corpus_bytes")
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1", field=name)
        if int(self.warmup_steps) < 0 or int(self.decay_steps) < int(self.warmup_steps):
            raise ConfigError(f"warmup_steps={self.warmup_steps} must be >= 0 and <= decay_steps={self.decay_steps}",
                              field="warmup_steps")
        if not 0.0 <= float(self.min_lr_ratio) <= 1.0:
            raise ConfigError(f"min_lr_ratio={self.min_lr_ratio} must be in [0, 1]", field="min_lr_ratio")
        if float(self.grad_clip) < 0:
            raise ConfigError(f"grad_clip={self.grad_clip} must be >= 0 (0 turns clipping off)", field="grad_clip")
        if self.vocab_size < BYTE_VOCAB + 1:
            raise ConfigError(f"vocab_size={self.vocab_size} must be >= 257 (bytes + end-of-document)",
                              field="vocab_size")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ConfigError(f"d_model={self.d_model} must be n_heads={self.n_heads} x an even head size",
                              field="d_model")
        if not 1 <= self.top_k <= self.n_experts:
            raise ConfigError(f"top_k={self.top_k} must be in [1, n_experts={self.n_experts}]", field="top_k")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule={self.schedule!r} must be one of {', '.join(map(repr, SCHEDULES))}",
                              field="schedule")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ConfigError(f"compute_dtype={self.compute_dtype!r} must be one of "
                              f"{', '.join(map(repr, COMPUTE_DTYPES))}", field="compute_dtype")
        if self.positions not in ("rope", "learned"):
            raise ConfigError(f"positions={self.positions!r} must be 'rope' or 'learned'", field="positions")
        if self.corpus_bytes < 2 * (self.seq_len + 1):
            raise ConfigError(f"corpus_bytes={self.corpus_bytes} too small for seq_len={self.seq_len}",
                              field="corpus_bytes")
        if layout is not None:
            self._validate_layout(layout.validate())
        return self

    def _validate_layout(self, layout: Layout) -> None:
        """Every degree must divide what it splits: ``tensor`` divides ``n_heads`` (hence the Q, K
        and V parts of ``d_model`` rows), ``d_expert`` (the shared expert's gate/up parts) and
        ``padded_vocab``; ``expert`` divides ``n_experts``; ``pipeline`` is at most ``n_layers`` (stages are balanced, earlier stages
        take the extra layers). Raises :class:`LayoutError` with ``key="layout.<degree>"``."""
        splits = [("tensor", "n_heads", self.n_heads), ("tensor", "padded_vocab", self.padded_vocab),
                  ("expert", "n_experts", self.n_experts)]
        if self.shared_expert:
            splits.append(("tensor", "d_expert", self.d_expert))
        for degree, name, size in splits:
            value = getattr(layout, degree)
            if size % value:
                fix = " (make vocab_multiple a multiple of it)" if name == "padded_vocab" else ""
                raise LayoutError(f"layout {degree}={value} does not divide {name}={size}{fix}: pick a {degree} "
                                  f"degree that divides {size}", key=f"layout.{degree}")
        if layout.pipeline > self.n_layers:
            raise LayoutError(
                f"pipeline={layout.pipeline} stages need at least as many layers (n_layers={self.n_layers})",
                key="layout.pipeline")

    def to_json(self) -> str:
        """A JSON object of every field (stable key order)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> GPTMoEConfig:
        """Build from a mapping of field names (e.g. parsed JSON); unknown names are a :class:`ConfigError`."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown gpt_moe config fields {unknown}; known: {sorted(known)}", field=unknown[0])
        values = dict(values)
        if "betas" in values:
            values["betas"] = tuple(values["betas"])
        return cls(**values)
