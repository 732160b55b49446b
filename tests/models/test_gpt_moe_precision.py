"""``compute_dtype: bfloat16``: fp32 masters, every parameter used rounded to bfloat16 (docs/models.md)."""

from __future__ import annotations

import pytest
import torch

from lifeline.errors import ConfigError
from lifeline.models.gpt_moe import GPTMoEConfig, GPTMoEStage, deterministic_cpu


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_a_bfloat16_stage_computes_what_an_fp32_stage_of_its_rounded_weights_computes(positions):
    deterministic_cpu()
    cfg = GPTMoEConfig(corpus_bytes=1 << 16, positions=positions)
    mixed = GPTMoEStage(GPTMoEConfig(**{**cfg.__dict__, "compute_dtype": "bfloat16"}))
    rounded = GPTMoEStage(cfg)
    with torch.no_grad():
        for p, q in zip(mixed.parameters(), rounded.parameters()):
            q.copy_(p.to(torch.bfloat16))
    assert any(not torch.equal(p, q) for p, q in zip(mixed.parameters(), rounded.parameters()))  # masters: fp32
    tokens = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=torch.Generator().manual_seed(0))
    outputs = []
    for stage in (mixed, rounded):
        logits, aux = stage(tokens)
        loss = stage.loss(logits, tokens) + aux
        loss.backward()
        outputs.append((loss.detach(), [p.grad.clone() for p in stage.parameters()]))
    (loss_m, grads_m), (loss_r, grads_r) = outputs
    assert torch.equal(loss_m, loss_r)
    # the gradient with respect to a master is the one with respect to its compute weight, in fp32
    assert all(g.dtype == torch.float32 and torch.equal(g, h) for g, h in zip(grads_m, grads_r))
    assert all(p.dtype == torch.float32 for p in mixed.parameters())


def test_an_fp32_stage_is_unchanged_and_an_unknown_compute_dtype_is_refused():
    deterministic_cpu()
    cfg = GPTMoEConfig(corpus_bytes=1 << 16)
    a, b = GPTMoEStage(cfg), GPTMoEStage(GPTMoEConfig(**{**cfg.__dict__, "compute_dtype": "bfloat16"}))
    tokens = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=torch.Generator().manual_seed(1))
    assert not torch.equal(a(tokens)[0], b(tokens)[0])  # the rounding is not a no-op
    with pytest.raises(ConfigError, match="compute_dtype") as info:
        GPTMoEConfig(compute_dtype="float16").validate()
    assert info.value.field == "compute_dtype"
