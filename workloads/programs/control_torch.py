"""A small GPT-like PyTorch training program whose checkpoint is complete: the audit's control.

What real training code has, small enough for a CPU: token and position
embeddings, one causal self-attention block with dropout, AdamW, warm-up then
cosine decay, a GradScaler, gradient accumulation over two micro-steps (each
testbed step is one micro-step: gradients are exposed for averaging only at
the end of a window), an EMA of the weights, and a sampler that shuffles each
epoch, with epochs of three steps, shorter than a run, so a resume crosses
one. Like PyTorch's DataLoader, creating the batch iterator draws its base
seed from the global generator, which dropout uses too.

Its save writes every Stateful, the global generator included; its load
creates the iterator first and restores the generator last. Each planted bug
(``bug_*.py``) is this file with one of those things done wrong; the
:class:`Program` takes its hooks as keyword arguments so a bug is a few lines.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

VOCAB, SEQ, WIDTH, SAMPLES, BATCH, ACCUMULATE, EPOCH_STEPS = 32, 8, 16, 24, 2, 2, 3


class TinyGPT(nn.Module):
    """Embeddings, one pre-norm causal attention block with an MLP, a tied output layer."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(SEQ, WIDTH)
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attention = nn.MultiheadAttention(WIDTH, 2, dropout=0.1, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))
        self.dropout = nn.Dropout(0.1)
        self.register_buffer("mask", torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tokens(x) + self.positions(torch.arange(x.shape[1]))
        a = self.norm1(h)
        h = h + self.dropout(self.attention(a, a, a, attn_mask=self.mask, need_weights=False)[0])
        h = h + self.dropout(self.mlp(self.norm2(h)))
        return h @ self.tokens.weight.T


class Sampler:
    """This rank's share of a fresh permutation each epoch (as DistributedSampler: seed + epoch)."""

    def __init__(self, seed: int, rank: int, world: int) -> None:
        self.seed, self.rank, self.world = seed, rank, world
        self.epoch, self.position, self.base_seed = 0, 0, 0

    def order(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        return torch.randperm(SAMPLES, generator=g)[self.rank :: self.world].tolist()

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "base_seed": self.base_seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.base_seed = int(state["base_seed"])


class Batches:
    """The data loader's iterator: created, it draws its base seed from the global generator."""

    def __init__(self, sampler: Sampler, data: torch.Tensor) -> None:
        self.sampler, self.data = sampler, data
        sampler.base_seed = int(torch.empty((), dtype=torch.int64).random_().item())

    def next(self) -> torch.Tensor:
        s = self.sampler
        if s.position >= EPOCH_STEPS * BATCH:
            s.epoch, s.position = s.epoch + 1, 0
            s.base_seed = int(torch.empty((), dtype=torch.int64).random_().item())
        idx = s.order()[s.position : s.position + BATCH]
        s.position += BATCH
        batch = self.data[idx].clone()
        noise = torch.Generator().manual_seed(s.base_seed + s.position)  # augmentation: token noise
        flip = torch.rand(batch.shape, generator=noise) < 0.05
        batch[flip] = torch.randint(0, VOCAB, batch.shape, generator=noise)[flip]
        return batch


class EMA:
    """An exponential moving average of the weights, its decay warming up with its update count."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.shadow = {k: p.detach().clone() for k, p in model.named_parameters()}
        self.updates = 0

    def update(self) -> None:
        decay = min(0.99, (1 + self.updates) / (10 + self.updates))
        with torch.no_grad():
            for k, p in self.model.named_parameters():
                self.shadow[k].mul_(decay).add_(p.detach(), alpha=1 - decay)
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        return {"shadow": dict(self.shadow), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state["shadow"].items():
            self.shadow[k].copy_(v)
        self.updates = int(state["updates"])


class Accumulation:
    """Where the current accumulation window stands: its micro-step and the gradients summed so far."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.micro = model, 0

    def state_dict(self) -> dict[str, Any]:
        grads = {
            k: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
            for k, p in self.model.named_parameters()
        }
        return {"micro": self.micro, "grads": grads}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.micro = int(state["micro"])
        for k, p in self.model.named_parameters():
            p.grad = state["grads"][k].clone()


class GlobalRNG:
    """The global generator (dropout, and the loader's base seed), as a Stateful."""

    def state_dict(self) -> dict[str, Any]:
        return {"torch": torch.get_rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])


def warmup_cosine(warmup: int, total: int) -> Any:
    """Linear warm-up for ``warmup`` optimizer steps, then cosine decay to a tenth over ``total``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        done = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))

    return factor


class Program:
    """The control. Keyword hooks let a planted bug change one thing."""

    def __init__(self, rank: int, world: int, seed: int, options: dict[str, Any]) -> None:
        self.rank = rank
        torch.manual_seed(seed)
        self.data = torch.randint(0, VOCAB, (SAMPLES, SEQ + 1), generator=torch.Generator().manual_seed(1))
        self.model = TinyGPT()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-3, weight_decay=0.1)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, warmup_cosine(2, 8))
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
        self.ema = EMA(self.model)
        self.accumulation = Accumulation(self.model)
        self.sampler = Sampler(seed, rank, world)
        torch.manual_seed(seed * 1000 + rank + 1)  # each rank its own dropout stream
        self.batches = Batches(self.sampler, self.data)
        self.statefuls: dict[str, Any] = {
            "model": self.model,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "scaler": self.scaler,
            "ema": self.ema,
            "accumulation": self.accumulation,
            "sampler": self.sampler,
            "rng": GlobalRNG(),
        }

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def forward_backward(self) -> float:
        self.model.train()
        batch = self.batches.next()
        logits = self.model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        self.scaler.scale(loss / ACCUMULATE).backward()
        return float(loss.detach())

    def gradients(self) -> dict[str, torch.Tensor]:
        if self.accumulation.micro + 1 < ACCUMULATE:
            return {}  # the window is not over: nothing to average yet
        return {k: p.grad for k, p in self.model.named_parameters() if p.grad is not None}

    def optimizer_step(self) -> None:
        self.accumulation.micro += 1
        if self.accumulation.micro < ACCUMULATE:
            return
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=False)
        self.scheduler.step()
        self.ema.update()
        self.accumulation.micro = 0

    def checkpoint(self) -> dict[str, Any]:
        """Everything the save writes, by Stateful."""
        return {name: s.state_dict() for name, s in self.statefuls.items()}

    def save(self, folder: str) -> None:
        torch.save(self.checkpoint(), Path(folder) / "checkpoint.pt")

    def restore(self, state: dict[str, Any]) -> None:
        """Load what :meth:`save` wrote: the iterator first (it draws), the global generator last."""
        self.batches = Batches(self.sampler, self.data)
        for name, s in self.statefuls.items():
            if name != "rng":
                s.load_state_dict(state[name])
        self.statefuls["rng"].load_state_dict(state["rng"])

    def load(self, folder: str) -> None:
        self.restore(torch.load(Path(folder) / "checkpoint.pt", weights_only=True))


def make(rank: int, world: int, seed: int, options: dict[str, Any]) -> Program:
    """The control program of ``rank``."""
    return Program(rank, world, seed, options)
