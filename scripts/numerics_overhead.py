"""Per-step overhead of the numerics check (docs/numerics.md, "Cost"): 2 gloo ranks (PP=2 or DP=2), the e2e
tests' model, N steps each way, interleaved: ``.venv/bin/python scripts/numerics_overhead.py dp|pp N``."""
import os, sys, time, statistics
import torch, torch.distributed as dist, torch.multiprocessing as mp
from lifeline.checkpoint import Layout
from lifeline.models.gpt_moe import GPTMoEConfig
from lifeline.models.gpt_moe._trainer import GPTMoETrainer, deterministic_cpu
from lifeline.runtime._numerics import NumericsGuard

ARGS = dict(d_model=32, n_layers=2, n_heads=4, d_expert=32, seq_len=32, micro_batch=2, micro_batches=2, corpus_bytes=65536)

def worker(rank, layout, steps, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    deterministic_cpu()
    t = GPTMoETrainer(GPTMoEConfig(**ARGS), layout, rank); t.connect()
    g = NumericsGuard(lambda *a, **k: None)
    times = {"plain": [], "checked": []}
    for i in range(steps * 2 + 4):
        mode = "checked" if i % 2 else "plain"
        dist.barrier()
        t0 = time.perf_counter()
        g.train_step(t) if mode == "checked" else t.train_step()
        dt = time.perf_counter() - t0
        if i >= 4: times[mode].append(dt)
    # the check alone: one all_reduce of 2*world float64 (what _check adds besides reading two floats)
    ar = []
    for _ in range(200):
        f = torch.zeros(4, dtype=torch.float64); t0 = time.perf_counter(); dist.all_reduce(f); ar.append(time.perf_counter() - t0)
    if rank == 0:
        out.put((statistics.median(times["plain"]), statistics.median(times["checked"]), statistics.median(ar), g.checks))
    dist.destroy_process_group()

if __name__ == "__main__":
    pp = sys.argv[1] == "pp"
    layout = Layout(pipeline=2) if pp else Layout(data=2)
    ctx = mp.get_context("spawn"); q = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(r, layout, int(sys.argv[2]), 29611 + pp, q)) for r in range(2)]
    [p.start() for p in ps]; res = q.get(); [p.join() for p in ps]
    plain, checked, ar, n = res
    print(f"{sys.argv[1]}: median step plain {plain*1e3:.2f} ms, checked {checked*1e3:.2f} ms, "
          f"difference {(checked-plain)*1e3:+.2f} ms; all_reduce(4 x float64) alone {ar*1e6:.0f} us; checks {n}")
