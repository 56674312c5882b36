"""Where a run's actors live: on a multi-node Ray cluster, each supernode on a Ray node of its own.

With one Ray node (the default private instance) every actor is local and
nothing here applies. With several, the cluster reserves a placement group
of one bundle per supernode (``STRICT_SPREAD`` when there are at least as
many nodes with CPU to spare as supernodes, else ``SPREAD``), and each
supernode's supervisor and NPU actors are scheduled into its bundle. When a
Ray node is lost, Ray re-places its bundle on another node if one is free:
the replacement actors of that supernode land there (node replacement).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testbed.core.errors import TestbedError

#: What a bundle reserves: a sliver of CPU, so that a node without CPUs (a head started with
#: ``num_cpus=0``) holds none, and the actors themselves ask for no resources.
BUNDLE = {"CPU": 0.01}


def ray_nodes() -> list[dict[str, Any]]:
    """Every Ray node the cluster knows, alive or dead (``ray.nodes()``)."""
    import ray

    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return nodes


def alive_nodes() -> list[dict[str, Any]]:
    """The Ray nodes alive now that can hold a bundle (they have CPU)."""
    return [
        n for n in ray_nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= BUNDLE["CPU"]
    ]


@dataclass
class Placement:
    """The placement group of a multi-node run (absent on one node)."""

    group: Any
    strategy: str
    supernodes: int

    @classmethod
    def reserve(cls, supernodes: int, timeout_s: float) -> Placement | None:
        """Reserve one bundle per supernode when Ray has several nodes; None on a single node."""
        import ray
        from ray.util.placement_group import placement_group

        if len([n for n in ray_nodes() if n.get("Alive")]) < 2:
            return None
        usable = len(alive_nodes())
        strategy = "STRICT_SPREAD" if usable >= supernodes else "SPREAD"
        group = placement_group([dict(BUNDLE) for _ in range(supernodes)], strategy=strategy)
        try:
            ray.get(group.ready(), timeout=timeout_s)
        except Exception as exc:
            ray.util.remove_placement_group(group)
            raise TestbedError(
                f"could not place {supernodes} supernodes on the Ray cluster's {usable} node(s) with CPU "
                f"within {timeout_s:.0f} s ({type(exc).__name__}); add nodes or free CPU on them",
                supernodes=supernodes,
            ) from None
        return cls(group, strategy, supernodes)

    def options(self, supernode: int) -> dict[str, Any]:
        """Actor options that put an actor of ``supernode`` into its bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.group, placement_group_bundle_index=supernode
            )
        }

    def release(self) -> None:
        """Give the reservation back (on a user's cluster nothing of the run may stay)."""
        import ray

        ray.util.remove_placement_group(self.group)
