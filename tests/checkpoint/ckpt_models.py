"""Helpers for the checkpoint tests: random models (full states + pattern rules) and comparisons."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from lifeline.checkpoint import (Expert, Layout, Padded, PatternRules, Sharded, SubParams, Zero1, shard_state)

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int8, torch.bool]

def make_rules(qkv_sizes: tuple[int, ...], mlp_sizes: tuple[int, ...], vocab: int, num_experts: int) -> PatternRules:
    """The name rules of the test model family (a GPT block with MoE and ZeRO-1 Adam state)."""
    return PatternRules([
        ("layers.*.attn.qkv", SubParams(0, qkv_sizes)),
        ("layers.*.mlp.gate_up", SubParams(1, mlp_sizes)),
        ("layers.*.attn.proj", Sharded(1)),
        ("layers.*.mlp.down", Sharded(0)),
        ("embed", Padded(0, vocab)),
        (r"re:layers\.(?P<layer>\d+)\.experts\.(?P<index>\d+)\.w", Expert(num_experts=num_experts)),
        ("optim.exp_avg.*", Zero1(r"\1")),
        ("optim.exp_avg_sq.*", Zero1(r"\1")),
    ])


def random_tensor(shape, dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype in (torch.int64, torch.int8):
        return torch.randint(-100, 100, shape, generator=gen).to(dtype)
    return torch.randn(shape, generator=gen).to(dtype)


@dataclass
class Model:
    """A full (consolidated) state and its rules."""

    full: dict
    rules: PatternRules

    def state(self, layout: Layout, rank: int) -> dict:
        return shard_state(self.full, layout, rank, self.rules)


def build_model(seed: int, t_lcm: int, e_lcm: int, hidden: int, vocab: int, layers: int, dtype, num_experts_mult: int = 1,
                zero: bool = True) -> Model:
    """A model whose tensor dims are multiples of ``t_lcm`` and expert count a multiple of ``e_lcm``."""
    gen = torch.Generator().manual_seed(seed)
    h = hidden * t_lcm
    qkv = (2 * h, t_lcm, t_lcm * 3)  # uneven parts (GQA-like)
    mlp = (3 * t_lcm, 5 * t_lcm)  # uneven SwiGLU-like parts along dim 1
    n_exp = e_lcm * num_experts_mult
    full: dict = {}
    for layer in range(layers):
        full[f"layers.{layer}.attn.qkv"] = random_tensor((sum(qkv), 3), dtype, gen)
        full[f"layers.{layer}.mlp.gate_up"] = random_tensor((2, sum(mlp)), dtype, gen)
        full[f"layers.{layer}.attn.proj"] = random_tensor((3, h), dtype, gen)
        full[f"layers.{layer}.mlp.down"] = random_tensor((h, 2, 2), dtype, gen)
        full[f"layers.{layer}.norm"] = random_tensor((h,), dtype, gen)
        for e in range(n_exp):
            full[f"layers.{layer}.experts.{e}.w"] = random_tensor((2, 3), dtype, gen)
    full["embed"] = random_tensor((vocab, 4), dtype, gen)
    full["scale"] = random_tensor((), dtype, gen)
    if zero:
        for name in ["layers.0.attn.qkv", "layers.0.mlp.gate_up", "layers.0.attn.proj", "layers.0.norm", "embed"]:
            full[f"optim.exp_avg.{name}"] = random_tensor(tuple(full[name].shape), torch.float32, gen)
            full[f"optim.exp_avg_sq.{name}"] = random_tensor(tuple(full[name].shape), torch.float32, gen)
    full["optim.step"] = torch.tensor(7, dtype=torch.int64)
    return Model(full, make_rules(qkv, mlp, vocab, n_exp))


def _divisors_layouts(max_world: int = 8) -> list[Layout]:
    out = []
    for t in (1, 2, 4):
        for p in (1, 2):
            for d in (1, 2, 4):
                for e in (1, 2):
                    if t * p * d * e <= max_world:
                        out.append(Layout(tensor=t, pipeline=p, data=d, expert=e))
    return out


LAYOUTS = _divisors_layouts()


@st.composite
def model_and_layouts(draw):
    """(Model, layout A, layout B) with random shapes, dtypes, uneven fused parts and padded vocabularies."""
    a = draw(st.sampled_from(LAYOUTS))
    b = draw(st.sampled_from(LAYOUTS))
    t_lcm = math.lcm(a.tensor, b.tensor)
    e_lcm = math.lcm(a.expert, b.expert)
    model = build_model(
        seed=draw(st.integers(0, 2**16)), t_lcm=t_lcm, e_lcm=e_lcm,
        hidden=draw(st.integers(1, 3)), vocab=draw(st.integers(1, 23)), layers=draw(st.integers(1, 2)),
        dtype=draw(st.sampled_from(DTYPES)), num_experts_mult=draw(st.integers(1, 2)),
    )
    return model, a, b


def pipeline_split(state: dict, layout: Layout, rank: int) -> dict:
    """Keep only the layers of this rank's pipeline stage (layers round-robin by stage); the rest stays on stage 0."""
    stage = layout.coords(rank).pipeline
    out = {}
    for k, v in state.items():
        name = k.removeprefix("optim.exp_avg_sq.").removeprefix("optim.exp_avg.")
        if name.startswith("layers."):
            owner = int(name.split(".")[1]) % layout.pipeline
        else:
            owner = 0
        if owner == stage:
            out[k] = v
    return out


def states_for(model: Model, layout: Layout) -> list[dict]:
    """Every rank's local state in ``layout`` (pipeline stages hold their own layers)."""
    return [pipeline_split(model.state(layout, r), layout, r) for r in range(layout.world_size)]


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(-1).view(torch.uint8) if a.dim() else a.reshape(1).view(torch.uint8),
                       b.contiguous().view(-1).view(torch.uint8) if b.dim() else b.reshape(1).view(torch.uint8))


def assert_states_equal(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        if isinstance(want[k], torch.Tensor):
            assert bit_equal(got[k], want[k]), k
        else:
            assert bytes(got[k]) == bytes(want[k]), k
