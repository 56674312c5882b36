"""A small numpy training program whose checkpoint is complete: the audit's control without PyTorch.

A two-layer network on a fixed synthetic regression task, SGD with momentum,
a step learning-rate schedule, a sampler that shuffles each epoch (epochs of
six steps, shorter than the run), and dropout masks drawn from the program's
own generator. Its save writes every Stateful: weights, momentum, schedule,
the sampler's epoch and position, and the generator's state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

SAMPLES, FEATURES, HIDDEN, BATCH = 96, 8, 16, 4


class Model:
    """Two layers; its gradients live beside its weights."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.params = {
            "w1": (rng.standard_normal((FEATURES, HIDDEN)) * 0.3).astype(np.float32),
            "w2": (rng.standard_normal((HIDDEN, 1)) * 0.3).astype(np.float32),
        }
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}

    def state_dict(self) -> dict[str, Any]:
        return {k: v.copy() for k, v in self.params.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            self.params[k][...] = v


class Momentum:
    """SGD with momentum."""

    def __init__(self, model: Model, momentum: float = 0.9) -> None:
        self.model, self.momentum = model, momentum
        self.velocity = {k: np.zeros_like(v) for k, v in model.params.items()}
        self.steps = 0

    def step(self, lr: float) -> None:
        for k, p in self.model.params.items():
            self.velocity[k] = (self.momentum * self.velocity[k] + self.model.grads[k]).astype(np.float32)
            p -= np.float32(lr) * self.velocity[k]
        self.steps += 1

    def state_dict(self) -> dict[str, Any]:
        return {"velocity": {k: v.copy() for k, v in self.velocity.items()}, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state["velocity"].items():
            self.velocity[k] = np.array(v, dtype=np.float32)
        self.steps = int(state["steps"])


class StepLR:
    """The learning rate halves every four steps."""

    def __init__(self, base: float = 0.05) -> None:
        self.base, self.last_step = base, 0

    @property
    def lr(self) -> float:
        return self.base * 0.5 ** (self.last_step // 4)

    def step(self) -> None:
        self.last_step += 1

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self.last_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_step = int(state["last_step"])


class Sampler:
    """This rank's share of a fresh permutation each epoch; epoch and position are its state."""

    def __init__(self, seed: int, rank: int, world: int) -> None:
        self.seed, self.rank, self.world = seed, rank, world
        self.epoch, self.position = 0, 0

    def _order(self) -> np.ndarray:
        perm = np.random.default_rng([self.seed, self.epoch]).permutation(SAMPLES)
        return perm[self.rank :: self.world]

    def next(self) -> np.ndarray:
        order = self._order()
        if self.position + BATCH > len(order) or self.position >= 6 * BATCH:
            self.epoch, self.position = self.epoch + 1, 0
            order = self._order()
        batch = order[self.position : self.position + BATCH]
        self.position += BATCH
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class Generator:
    """The program's own generator (dropout masks)."""

    def __init__(self, seed: int, rank: int) -> None:
        self.rng = np.random.default_rng([seed, rank, 7])

    def state_dict(self) -> dict[str, Any]:
        return {"bit_generator": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["bit_generator"]


class Program:
    """The control: every phase of a step, and a save that holds every Stateful."""

    def __init__(self, rank: int, world: int, seed: int, options: dict[str, Any]) -> None:
        data = np.random.default_rng(1234)
        self.x = data.standard_normal((SAMPLES, FEATURES)).astype(np.float32)
        self.y = (self.x @ data.standard_normal((FEATURES, 1))).astype(np.float32)
        self.model = Model(np.random.default_rng(seed))
        self.optimizer = Momentum(self.model)
        self.scheduler = StepLR()
        self.sampler = Sampler(seed, rank, world)
        self.rng = Generator(seed, rank)
        self.statefuls = {
            "model": self.model,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "sampler": self.sampler,
            "rng": self.rng,
        }

    @property
    def lr(self) -> float:
        return self.scheduler.lr

    def forward_backward(self) -> float:
        idx = self.sampler.next()
        x, y = self.x[idx], self.y[idx]
        w1, w2 = self.model.params["w1"], self.model.params["w2"]
        h = np.maximum(x @ w1, 0)
        mask = (self.rng.rng.random(h.shape) > 0.1).astype(np.float32) / np.float32(0.9)
        hd = h * mask
        err = hd @ w2 - y
        loss = float(np.mean(err**2))
        d_out = (2 * err / len(idx)).astype(np.float32)
        self.model.grads["w2"] = (hd.T @ d_out).astype(np.float32)
        d_h = (d_out @ w2.T) * mask * (h > 0)
        self.model.grads["w1"] = (x.T @ d_h).astype(np.float32)
        return loss

    def gradients(self) -> dict[str, np.ndarray]:
        return self.model.grads

    def optimizer_step(self) -> None:
        self.optimizer.step(self.scheduler.lr)
        self.scheduler.step()

    def save(self, folder: str) -> None:
        path = Path(folder)
        arrays = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        arrays.update({f"velocity.{k}": v for k, v in self.optimizer.velocity.items()})
        np.savez(path / "arrays.npz", **arrays)
        rest = {
            "optimizer_steps": self.optimizer.steps,
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "rng": self.rng.state_dict(),
        }
        (path / "state.json").write_text(json.dumps(rest))

    def load(self, folder: str) -> None:
        path = Path(folder)
        with np.load(path / "arrays.npz", allow_pickle=False) as arrays:
            self.model.load_state_dict({k[6:]: arrays[k] for k in arrays.files if k.startswith("model.")})
            velocity = {k[9:]: arrays[k] for k in arrays.files if k.startswith("velocity.")}
        rest = json.loads((path / "state.json").read_text())
        self.optimizer.load_state_dict({"velocity": velocity, "steps": rest["optimizer_steps"]})
        self.scheduler.load_state_dict(rest["scheduler"])
        self.sampler.load_state_dict(rest["sampler"])
        self.rng.load_state_dict(rest["rng"])


def make(rank: int, world: int, seed: int, options: dict[str, Any]) -> Program:
    """The control program of ``rank``."""
    return Program(rank, world, seed, options)
