"""A workload: data-parallel linear regression with momentum SGD, the smallest complete training job.

Every rank reads its own slice of each global batch of a seeded data set, adds
noise from its own generator, and averages its gradient with the others' over
the ``replica`` group. All five checkpoint components are real state: the
weights, the momentum (and update count), the learning-rate decay's position,
each rank's noise generator, and the data cursor.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

import testbed

DEFAULTS: dict[str, Any] = {
    "inputs": 8,
    "batch": 16,
    "samples": 512,
    "lr": 0.05,
    "momentum": 0.9,
    "noise": 0.1,
}
Arrays = dict[str, np.ndarray]


class LinearRegression:
    """One data-parallel rank of the linear regression job."""

    components: tuple[str, ...] = ("params", "optimizer", "lr_scheduler", "rng", "data_cursor")

    def __init__(self, options: Mapping[str, Any], seed: int, rank: int, layout: Any) -> None:
        self.o = {**DEFAULTS, **options}
        self.seed, self.rank, self.world = seed, rank, int(layout.world)
        data = np.random.default_rng([seed, 0xDA7A])
        n, d = int(self.o["samples"]), int(self.o["inputs"])
        self.x = data.standard_normal((n, d)).astype(np.float32)
        self.y = (self.x @ data.standard_normal(d)).astype(np.float32)
        self.w = np.zeros(d, np.float32)
        self.velocity = np.zeros(d, np.float32)
        self.updates = 0  # the optimizer's and the decay's position
        self.draws = 0  # this rank's noise generator: one draw per step
        self.cursor = 0  # global batches read

    def flops_per_step(self) -> float:
        """2 forward and 4 backward FLOPs per weight and sample."""
        return 6.0 * int(self.o["batch"]) * int(self.o["inputs"])

    def forward_backward(self, ctx: testbed.StepContext) -> tuple[float, Arrays, int]:
        """Mean squared error and its gradient on this rank's slice of the next global batch."""
        ctx.use("matmul", "linear")
        b = int(self.o["batch"])
        idx = (np.arange(b) + (self.cursor * self.world + self.rank) * b) % len(self.x)
        self.cursor += 1
        noise = np.random.default_rng([self.seed, self.rank, self.draws]).standard_normal(b)
        self.draws += 1
        x, y = self.x[idx], self.y[idx] + (float(self.o["noise"]) * noise).astype(np.float32)
        diff = x @ self.w - y
        flops = self.flops_per_step()
        ctx.compute(flops / 3)
        ctx.enter("backward")
        ctx.compute(flops - flops / 3)
        grad = ((2.0 / b) * (x.T @ diff)).astype(np.float32)
        return float(np.mean(diff**2)), {"w": grad}, b

    def sync_plan(self) -> dict[str, int]:
        """One allreduce of the gradient over the data-parallel group."""
        return {"replica": self.w.nbytes}

    def sync_grads(self, ctx: testbed.StepContext, grads: Arrays) -> Arrays:
        """Average the gradient over every rank."""
        return {"w": ctx.groups["replica"].allreduce(grads["w"], op="avg", algo=ctx.algo("replica"))}

    def apply(self, ctx: testbed.StepContext | None, grads: Arrays) -> float:
        """Momentum SGD with a 1/(1 + t/100) decay; returns the learning rate used."""
        lr = float(self.o["lr"]) / (1.0 + self.updates / 100.0)
        self.velocity = (np.float32(self.o["momentum"]) * self.velocity + grads["w"]).astype(np.float32)
        self.w = (self.w - np.float32(lr) * self.velocity).astype(np.float32)
        self.updates += 1
        return lr

    def state(self, component: str) -> Arrays:
        """The arrays of ``component``."""
        if component == "params":
            return {"w": self.w.copy()}
        if component == "optimizer":
            return {"m.w": self.velocity.copy(), "t": np.asarray(self.updates, np.int64)}
        if component == "lr_scheduler":
            return {"position": np.asarray(self.updates, np.int64)}
        if component == "rng":
            return {"key": np.asarray([self.seed, self.rank, self.draws], np.int64)}
        if component == "data_cursor":
            return {"cursor": np.asarray(self.cursor, np.int64)}
        raise KeyError(component)

    def load(self, component: str, arrays: Mapping[str, np.ndarray]) -> None:
        """Restore ``component`` from :meth:`state`'s arrays."""
        if component == "params":
            self.w = np.array(arrays["w"], np.float32)
        elif component == "optimizer":
            self.velocity, self.updates = np.array(arrays["m.w"], np.float32), int(arrays["t"])
        elif component == "lr_scheduler":
            self.updates = int(arrays["position"])
        elif component == "rng":
            self.draws = int(arrays["key"][2])
        elif component == "data_cursor":
            self.cursor = int(arrays["cursor"])
        else:
            raise KeyError(component)

    def params_digest(self) -> str:
        """sha256 of the weights."""
        return hashlib.sha256(self.w.tobytes()).hexdigest()

    def persistent_bytes(self) -> dict[str, int]:
        """The weights and the momentum live on the device."""
        return {"params": self.w.nbytes, "momentum": self.velocity.nbytes}

    def step_bytes(self, step: int) -> testbed.StepBuffers:
        """The batch's activations, the gradient and its communication buffer."""
        b, d = int(self.o["batch"]), int(self.o["inputs"])
        return testbed.StepBuffers(workspace=0, activations=4 * b * d, keep=0, grads=4 * d, comm=4 * d)


def validate(options: Mapping[str, Any], layout: Any) -> list[str]:
    """Data-parallel only."""
    if layout.world == layout.dp:
        return []
    return ["the linear workload is data-parallel only; set tp, pp and ep to 1"]


LINEAR = testbed.WorkloadInfo(
    name="linear",
    description="data-parallel linear regression with momentum SGD (an example plugin's workload)",
    factory=LinearRegression,
    options=DEFAULTS,
    validate=validate,
)
