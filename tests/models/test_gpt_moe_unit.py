"""GPT-MoE in one process: patterns, state round trip, data loader, MoE routing, config checks."""

from __future__ import annotations

import pytest
import torch

from lifeline.checkpoint import Expert, Layout, MemoryStorage, Padded, Replicated, SubParams, consolidate, plan_shard
from lifeline.checkpoint import save_states
from lifeline.errors import ConfigError, LayoutError
from lifeline.models.gpt_moe import (
    EOD_TOKEN,
    check,
    GPTMoEConfig,
    GPTMoESpec,
    MoE,
    StdlibLoader,
    pattern_rules,
    stage_layers,
    stdlib_corpus,
)

SMALL = GPTMoEConfig(corpus_bytes=1 << 18)


def trainer(cfg=SMALL, layout=Layout(), rank=0):
    t = GPTMoESpec(cfg).build(layout, rank)
    if layout.world_size == 1:
        t.connect()
    return t


@pytest.mark.parametrize("positions", ["rope", "learned"])
@pytest.mark.parametrize("shared", [True, False])
def test_patterns_cover_every_tensor_of_every_stage(positions, shared):
    cfg = GPTMoEConfig(positions=positions, shared_expert=shared, n_layers=3, corpus_bytes=1 << 16)
    rules = pattern_rules(cfg)
    assert rules.default is None
    seen = set()
    for stage in range(3):
        from lifeline.models.gpt_moe import GPTMoEStage

        model = GPTMoEStage(cfg, stage, 3)
        opt = torch.optim.AdamW(model.parameters())
        from lifeline.models.gpt_moe import state as model_state

        loader = StdlibLoader(stdlib_corpus(cfg.corpus_bytes), cfg.seq_len, 2)
        values = model_state(model, opt, loader)
        for fqn, v in values.items():
            if isinstance(v, torch.Tensor):
                rules.match(fqn)  # raises LayoutError when no rule covers it
                seen.add(fqn)
        plan_shard(values, Layout(pipeline=3), 0, rules)
    assert rules.match("embed.weight") == Padded(0, 257)
    assert rules.match("optim.exp_avg_sq.lm_head.weight") == Padded(0, 257)
    assert rules.match("layers.2.attn.qkv.weight") == SubParams(0, (64, 64, 64))
    assert rules.match("optim.exp_avg.layers.1.moe.experts.3.down.weight") == Expert(1, 3, num_experts=4)
    assert rules.match("optim.step.norm.weight") == Replicated()
    with pytest.raises(LayoutError):
        rules.match("layers.0.unknown.weight")
    assert any(k.startswith("layers.2.") for k in seen) and "lm_head.weight" in seen


def test_stages_partition_the_layers():
    assert [list(stage_layers(5, 2, s)) for s in range(2)] == [[0, 1, 2], [3, 4]]
    assert [list(stage_layers(4, 4, s)) for s in range(4)] == [[0], [1], [2], [3]]


def test_initialisation_is_layout_independent_and_padding_is_zero():
    whole = dict(trainer().model.named_parameters())
    for stage in range(2):
        part = dict(trainer(layout=Layout(pipeline=2), rank=stage).model.named_parameters())
        for k, v in part.items():
            assert torch.equal(v, whole[k]), k
    assert torch.count_nonzero(whole["embed.weight"][SMALL.vocab_size:]) == 0
    assert SMALL.padded_vocab == 320


@pytest.mark.parametrize("layout", [Layout(tensor=2), Layout(expert=2), Layout(tensor=2, pipeline=2, expert=2),
                                    Layout(tensor=4, expert=4)])
def test_sharded_initialisation_consolidates_to_the_whole_one(layout):
    # every rank draws the full tensor and keeps its shard: the shards, saved in `layout` and
    # consolidated through the universal format, are the one-rank parameters bit for bit
    storage = MemoryStorage()
    ranks = [trainer(layout=layout, rank=r) for r in range(layout.world_size)]
    save_states(storage, "ck", "init", 0, layout, ranks[0].rules, [t.state() for t in ranks])
    full = consolidate(storage, "ck", "init", 0)
    whole = trainer().state()
    names = [k for k, v in whole.items() if isinstance(v, torch.Tensor)]
    assert sorted(names) == sorted(full)
    for k in names:
        padded = k.endswith(("embed.weight", "lm_head.weight")) and not k.startswith("optim.step.")
        expect = whole[k][: SMALL.vocab_size] if padded else whole[k]
        assert torch.equal(full[k], expect), k
    qkv = dict(ranks[1].model.named_parameters())["layers.0.attn.qkv.weight"] if layout.tensor > 1 else None
    if qkv is not None:  # rank 1 holds the second slice of each of Q, K and V
        d, part = SMALL.d_model, SMALL.d_model // layout.tensor
        rows = torch.cat([whole["layers.0.attn.qkv.weight"][i * d + part: i * d + 2 * part] for i in range(3)])
        assert torch.equal(qkv, rows)
    experts = {k.split(".")[4] for r in ranks if r.coords.expert == layout.expert - 1
               for k, _ in r.model.named_parameters() if ".experts." in k}
    per = SMALL.n_experts // layout.expert
    assert experts == {str(e) for e in range(SMALL.n_experts - per, SMALL.n_experts)}


def test_padding_rows_stay_zero_while_training():
    t = trainer()
    for _ in range(3):
        t.train_step()
    params = dict(t.model.named_parameters())
    for name in ("embed.weight", "lm_head.weight"):
        assert torch.count_nonzero(params[name][SMALL.vocab_size:]) == 0


def test_state_round_trip_resumes_bit_identically():
    a = trainer()
    for _ in range(3):
        a.train_step()
    saved = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in a.state().items()}
    expected = [a.train_step().loss for _ in range(2)]
    b = trainer()
    b.train_step()
    out, aux = b.model(b.loader.batch_at(0)[:, :-1])  # a step interrupted mid-backward leaves gradients
    (out.sum() + aux).backward()
    b.load_state(saved)
    assert b.step == 3
    assert [b.train_step().loss for _ in range(2)] == expected
    for (ka, va), (kb, vb) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert ka == kb and torch.equal(va, vb), ka


def test_state_through_the_universal_format_consolidates():
    t = trainer()
    t.train_step()
    storage = MemoryStorage()
    values = t.state()
    save_states(storage, "ck", "unit", 1, Layout(), t.rules, [values])
    full = consolidate(storage, "ck", "unit", 1)
    assert torch.equal(full["embed.weight"], values["embed.weight"][: SMALL.vocab_size])
    assert full["layers.0.moe.experts.2.gate_up.weight"].shape == (2 * SMALL.d_expert, SMALL.d_model)
    assert torch.equal(full["optim.exp_avg.layers.1.attn.qkv.weight"], values["optim.exp_avg.layers.1.attn.qkv.weight"])


def test_loader_is_deterministic_seekable_and_disjoint_across_replicas():
    corpus = stdlib_corpus(1 << 18)
    assert corpus.dtype == torch.int16 and int(corpus.max()) == EOD_TOKEN
    assert int((corpus == EOD_TOKEN).sum()) >= 2, "several stdlib files, each ended by EOD"
    loaders = [StdlibLoader(corpus, 64, 4, replica=r, replicas=2, seed=1) for r in range(2)]
    batches = [ld.batch_at(5) for ld in loaders]
    assert batches[0].shape == (4, 65) and batches[0].dtype == torch.int64
    rows = {tuple(row.tolist()) for b in batches for row in b}
    assert len(rows) == 8, "replica groups read disjoint samples"
    again = StdlibLoader(corpus, 64, 4, replica=0, replicas=2, seed=1)
    again.load_state(loaders[0].state())
    for _ in range(5):
        loaders[0].next()
    again.load_state(loaders[0].state())
    assert torch.equal(again.next(), batches[0])
    other = StdlibLoader(stdlib_corpus(1 << 17), 64, 4)
    with pytest.raises(ConfigError):
        other.load_state(loaders[0].state())


def test_moe_routes_top_k_and_balancing_loss_is_one_when_uniform():
    cfg = GPTMoEConfig(corpus_bytes=1 << 16)
    moe = MoE(cfg)
    with torch.no_grad():
        moe.router.weight.zero_()  # uniform probabilities: f_i = P_i = 1/E
    x = torch.randn(32, cfg.d_model, generator=torch.Generator().manual_seed(0))
    out, aux = moe(x)
    assert out.shape == x.shape
    assert aux.item() == pytest.approx(1.0, abs=1e-6)
    torch.nn.init.normal_(moe.router.weight, generator=torch.Generator().manual_seed(1))
    _, skewed = moe(x * 10)
    assert skewed.item() > 1.0
    out.sum().backward()
    routed = [e for e in moe.experts.values() if e.gate_up.weight.grad is not None]
    assert len(routed) >= cfg.top_k


@pytest.mark.parametrize(
    "kwargs, field",
    [({"top_k": 5}, "top_k"), ({"d_model": 30}, "d_model"), ({"vocab_size": 100}, "vocab_size"),
     ({"positions": "alibi"}, "positions"), ({"seq_len": 0}, "seq_len")],
)
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(ConfigError) as err:
        GPTMoEConfig(**kwargs).validate()
    assert err.value.field == field


def test_connect_without_a_process_group_is_a_config_error():
    with pytest.raises(ConfigError) as err:
        GPTMoESpec(SMALL).build(Layout(data=2), 0).connect()
    assert err.value.field == "layout"


@pytest.mark.parametrize(
    "cfg, layout, key, words",
    [
        (GPTMoEConfig(n_heads=4), Layout(tensor=3), "layout.tensor", "n_heads=4"),
        (GPTMoEConfig(d_model=96, n_heads=6), Layout(tensor=4), "layout.tensor", "n_heads=6"),
        (GPTMoEConfig(vocab_multiple=6), Layout(tensor=4), "layout.tensor", "padded_vocab=258"),
        (GPTMoEConfig(d_expert=6), Layout(tensor=4), "layout.tensor", "d_expert=6"),
        (GPTMoEConfig(n_experts=4), Layout(expert=3), "layout.expert", "n_experts=4"),
        (GPTMoEConfig(n_layers=2), Layout(pipeline=3), "layout.pipeline", "n_layers=2"),
    ],
)
def test_layouts_the_trainer_cannot_take(cfg, layout, key, words):
    with pytest.raises(LayoutError) as err:
        cfg.validate(layout)
    assert err.value.key == key and words in err.value.message
    degree = key.split(".")[1]
    with pytest.raises(ConfigError) as checked:
        check({k: v for k, v in cfg.__dict__.items() if k != "betas"}, layout.to_dict())
    assert checked.value.field == key and words in checked.value.message, degree


def test_layouts_the_trainer_takes():
    for layout in (Layout(tensor=2), Layout(expert=2), Layout(expert=4), Layout(tensor=4, expert=2, pipeline=2),
                   Layout(tensor=2, pipeline=2, data=3, expert=2)):
        GPTMoEConfig().validate(layout)
    GPTMoEConfig(shared_expert=False, d_expert=6).validate(Layout(tensor=2))  # no shared expert to split


def test_unknown_config_field_is_named():
    with pytest.raises(ConfigError) as err:
        GPTMoEConfig.from_mapping({"d_modle": 3})
    assert err.value.field == "d_modle"
