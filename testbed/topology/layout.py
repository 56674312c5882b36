"""The parallel layout: which rank holds which slice of the model, and which groups it joins.

A job of ``dp x tp x pp x ep`` ranks is laid out topology-first (Megatron's
order): tensor parallelism innermost, so a TP group is consecutive ranks and
stays inside a supernode whenever ``tp`` divides the supernode's NPU count;
then expert parallelism, then pipeline stages, then data parallelism, whose
gradient allreduce is the one collective per step that may cross supernodes.

``rank = tp_i + tp * (ep_i + ep * (pp_i + pp * dp_i))``

Expert parallelism is a form of data parallelism for the dense layers: every
EP rank reads its own micro-batches, so the dense layers' gradients are
averaged over ``dp x ep`` replicas and the experts' over ``dp``.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.topology.presets import Topology

#: Axes from innermost (consecutive ranks) to outermost.
AXES = ("tp", "ep", "pp", "dp")


@dataclass(frozen=True)
class Coords:
    """A rank's position on every axis."""

    dp: int
    tp: int
    pp: int
    ep: int

    def on(self, axis: str) -> int:
        """The index on ``axis``."""
        value: int = getattr(self, axis)
        return value


@dataclass(frozen=True)
class Layout:
    """Degrees of data, tensor, pipeline and expert parallelism."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1

    @property
    def world(self) -> int:
        """Ranks the layout needs."""
        return self.dp * self.tp * self.pp * self.ep

    @property
    def replicas(self) -> int:
        """Ranks that read different data for the same dense weights (``dp x ep``)."""
        return self.dp * self.ep

    def degree(self, axis: str) -> int:
        """The degree of ``axis``."""
        value: int = getattr(self, axis)
        return value

    def coords(self, rank: int) -> Coords:
        """Where ``rank`` sits on each axis."""
        rest = rank
        found: dict[str, int] = {}
        for axis in AXES:
            found[axis] = rest % self.degree(axis)
            rest //= self.degree(axis)
        return Coords(**found)

    def rank_of(self, c: Coords) -> int:
        """The rank at ``c``."""
        rank, stride = 0, 1
        for axis in AXES:
            rank += c.on(axis) * stride
            stride *= self.degree(axis)
        return rank

    def stride(self, axis: str) -> int:
        """How far apart two ranks are that differ by one on ``axis`` only."""
        stride = 1
        for inner in AXES[: AXES.index(axis)]:
            stride *= self.degree(inner)
        return stride

    def group(self, rank: int, axes: tuple[str, ...]) -> list[int]:
        """Ranks that differ from ``rank`` only along ``axes`` (sorted)."""
        base = self.coords(rank)
        members = [rank - sum(base.on(axis) * self.stride(axis) for axis in set(axes))]
        for axis in dict.fromkeys(axes):  # by rank arithmetic: each NPU forms its groups for 384 ranks
            steps = [i * self.stride(axis) for i in range(self.degree(axis))]
            members = [m + step for m in members for step in steps]
        return sorted(members)

    def describe(self) -> str:
        """``dp2 x tp2 x pp2 x ep1``."""
        return " x ".join(f"{axis}{self.degree(axis)}" for axis in ("dp", "tp", "pp", "ep"))


def split_tp_groups(layout: Layout, topo: Topology) -> list[list[int]]:
    """The TP groups whose members sit in more than one supernode, each once, in rank order."""
    split: list[list[int]] = []
    for rank in range(layout.world):
        members = layout.group(rank, ("tp",))
        if members[0] == rank and len({topo.supernode_of(r) for r in members}) > 1:
            split.append(members)
    return split


def placement_warnings(layout: Layout, topo: Topology) -> list[str]:
    """A warning per TP group that spans supernodes (its per-layer allreduces cross the slow links)."""
    warnings: list[str] = []
    for members in split_tp_groups(layout, topo):
        nodes = sorted({topo.supernode_of(r) for r in members})
        warnings.append(
            f"TP group {list(members)} spans supernodes {nodes}: its allreduces (two per layer and "
            f"micro-batch) cross the inter-supernode links; use tp <= {topo.npus_per_supernode} "
            f"dividing npus_per_supernode ({topo.npus_per_supernode}) to keep TP inside a supernode"
        )
    return warnings
