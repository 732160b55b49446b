"""The GPT-MoE trainer of one rank: GPipe pipeline schedule, data-parallel all-reduce, AdamW."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from lifeline.checkpoint import Layout, PatternRules
from lifeline.errors import ConfigError
from lifeline.models.gpt_moe._config import GPTMoEConfig
from lifeline.models.gpt_moe._data import StdlibLoader, stdlib_corpus
from lifeline.models.gpt_moe._patterns import pattern_rules
from lifeline.models.gpt_moe._stage import GPTMoEStage
from lifeline.models.gpt_moe._state import load_state, state

__all__ = ["GPTMoETrainer", "StepResult", "deterministic_cpu"]


@dataclass(frozen=True)
class StepResult:
    """One optimizer step: ``step`` completed steps after it, ``loss`` the language-model cross
    entropy (nats/token, mean over data-parallel replica groups; ``None`` except on the last
    stage), ``aux_loss`` the stage's load-balancing loss (mean over micro-batches), ``tokens`` the
    tokens the whole job trained on in this step, ``seconds`` the step's wall time."""

    step: int
    loss: float | None
    aux_loss: float
    tokens: int
    seconds: float


def deterministic_cpu(threads: int = 1) -> None:
    """Make CPU training reproducible bit for bit: deterministic algorithms, fixed thread count."""
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)


class GPTMoETrainer:
    """The reference trainer of global ``rank`` in ``layout`` (pipeline × data; tensor = expert = 1).

    * Pipeline: stage ``coords.pipeline`` of ``layout.pipeline`` runs its layers; each step runs
      ``cfg.micro_batches`` micro-batches with the GPipe schedule (Huang et al. 2019, §2.2: all
      forwards, then all backwards in reverse order), sending activations forward and their
      gradients backward with ``torch.distributed.send``/``recv`` on the default process group.
    * Data parallel: after the backward pass the gradients (and the loss, for reporting) are
      flattened into one buffer, summed with one ``all_reduce`` over the replica group of the
      stage, divided by ``layout.data`` — the same order every step, hence deterministic.
    * AdamW (``foreach=False``), ``cfg.lr``; the step count is the data loader's position.

    Call :meth:`connect` after every (re)initialisation of the default process group (it builds
    the data-parallel groups, a collective every rank must join); single-process runs
    (world size 1) need no process group at all.
    """

    def __init__(self, cfg: GPTMoEConfig, layout: Layout, rank: int) -> None:
        cfg.validate(layout)
        self.cfg, self.layout, self.rank = cfg, layout, rank
        self.coords = layout.coords(rank)
        self.rules: PatternRules = pattern_rules(cfg)
        self.model = GPTMoEStage(cfg, self.coords.pipeline, layout.pipeline)
        self.params = list(self.model.parameters())
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                                           weight_decay=cfg.weight_decay, foreach=False)
        for p in self.params:
            p.grad = torch.zeros_like(p)
        self.loader = StdlibLoader(stdlib_corpus(cfg.corpus_bytes), cfg.seq_len,
                                   cfg.micro_batch * cfg.micro_batches, self.coords.data, layout.data, cfg.seed)
        self.rng = torch.Generator().manual_seed(cfg.seed + 7919 * (rank + 1))
        stage = self.coords.pipeline
        self.prev = layout.rank(dataclasses.replace(self.coords, pipeline=stage - 1)) if stage > 0 else None
        self.next = layout.rank(dataclasses.replace(self.coords, pipeline=stage + 1)) \
            if stage < layout.pipeline - 1 else None
        self.dp_group = None
        self._distributed = False

    @property
    def step(self) -> int:
        """Completed optimizer steps (equal to the data loader's position)."""
        return self.loader.position

    def connect(self, timeout: timedelta | None = None) -> None:
        """Build this generation's data-parallel groups on the (new) default process group.

        Every rank of the world must call it, in the same order (``dist.new_group`` is collective).
        ``timeout`` bounds each collective of those groups (torch's default, 30 min, when ``None``;
        the runtime passes its collective timeout so a hung peer is detected in time).
        """
        self._distributed = dist.is_available() and dist.is_initialized()
        self.dp_group = None
        if not self._distributed:
            if self.layout.world_size != 1:
                raise ConfigError(f"layout {self.layout.to_dict()} has {self.layout.world_size} ranks: initialise "
                                  "torch.distributed (lifeline.runtime.init) before connect()", field="layout")
            return
        for stage in range(self.layout.pipeline):
            ranks = [self.layout.rank(dataclasses.replace(self.coords, pipeline=stage, data=d))
                     for d in range(self.layout.data)]
            group = dist.new_group(ranks, timeout=timeout) if self.layout.data > 1 else None
            if stage == self.coords.pipeline:
                self.dp_group = group

    def disconnect(self) -> None:
        """Drop this generation's data-parallel group so its gloo sockets close with the process group.

        A group still referenced keeps its sockets open after the default group is destroyed, and
        the peers of this rank then wait out their whole collective timeout instead of seeing the
        connection close (measured: 30 s vs 0.4 s with two gloo processes).
        """
        self.dp_group = None
        self._distributed = False

    def train_step(self) -> StepResult:
        """Run one optimizer step on the next batch; returns its :class:`StepResult`.

        Raises whatever ``torch.distributed`` raises when a peer fails (``RuntimeError`` /
        ``DistBackendError``): the runtime's recovery loop handles it.
        """
        cfg = self.cfg
        start = time.perf_counter()
        batch = self.loader.batch_at(self.loader.position).view(cfg.micro_batches, cfg.micro_batch, cfg.seq_len + 1)
        inputs, targets = batch[..., :-1], batch[..., 1:]
        m_count = cfg.micro_batches
        saved: list[tuple[Tensor | None, Tensor, Tensor]] = []
        lm_total = torch.zeros(())
        aux_total = 0.0
        for m in range(m_count):  # GPipe: every forward first
            if self.prev is None:
                x = inputs[m]
            else:
                x = torch.empty(cfg.micro_batch, cfg.seq_len, cfg.d_model)
                dist.recv(x, src=self.prev)
                x.requires_grad_(True)
            out, aux = self.model(x)
            aux_total += float(aux.detach())
            if self.next is None:
                lm = F.cross_entropy(out.reshape(-1, cfg.vocab_size), targets[m].reshape(-1))
                lm_total += lm.detach()
                out = (lm + cfg.aux_loss_coef * aux) / m_count
            else:
                dist.send(out.detach().contiguous(), dst=self.next)
            saved.append((x if self.prev is not None else None, out, aux))
        for m in reversed(range(m_count)):  # then every backward, last micro-batch first
            x, out, aux = saved[m]
            if self.next is None:
                out.backward()
            else:
                grad = torch.empty_like(out)
                dist.recv(grad, src=self.next)
                aux_scaled = aux * (cfg.aux_loss_coef / m_count)
                if aux_scaled.requires_grad:
                    torch.autograd.backward([out, aux_scaled], [grad, torch.ones(())])
                else:
                    out.backward(grad)
            if x is not None:
                dist.send(x.grad.contiguous(), dst=self.prev)
        loss = self._reduce_gradients(lm_total / m_count)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
        self.loader.position += 1
        tokens = cfg.tokens_per_step * self.layout.data
        return StepResult(self.step, loss if self.next is None else None, aux_total / m_count, tokens,
                          time.perf_counter() - start)

    def _reduce_gradients(self, loss: Tensor) -> float:
        if self.dp_group is None:
            return float(loss)
        flat = torch.cat([p.grad.reshape(-1) for p in self.params] + [loss.reshape(1)])
        dist.all_reduce(flat, group=self.dp_group)
        flat.div_(self.layout.data)
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad.copy_(flat[offset: offset + n].view_as(p))
            offset += n
        return float(flat[-1])

    def state(self) -> dict[str, Tensor | bytes]:
        """This rank's checkpoint state (see :func:`lifeline.models.gpt_moe.state`)."""
        return state(self.model, self.optimizer, self.loader, self.rng)

    def load_state(self, values: Mapping[str, Tensor | bytes]) -> None:
        """Restore parameters, AdamW state, data position and RNG from a checkpoint state.

        Gradients are zeroed: a step interrupted by a failure may have accumulated part of them.
        """
        load_state(self.model, self.optimizer, self.loader, values, self.rng)
        self.optimizer.zero_grad(set_to_none=False)
