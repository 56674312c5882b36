"""Cluster topology: supernodes of NPUs, the link classes between them, and presets.

Ranks are numbered supernode-major: rank ``r`` lives on supernode
``r // npus_per_supernode``. A link is a directed rank pair of class ``intra``
(same supernode: UB / HCCS) or ``inter`` (RoCE between supernodes).
"""

from __future__ import annotations

from dataclasses import dataclass

INTRA = "intra"
INTER = "inter"


@dataclass(frozen=True)
class LinkClass:
    """Latency (s) and bandwidth (bytes/s, one direction) of one class of link."""

    name: str
    latency_s: float
    bandwidth_Bps: float


@dataclass(frozen=True)
class LinkSetupModel:
    """Seeded time model of link setup (建链): ``base + jitter*u + per_link*links_at_once``.

    ``u`` is uniform in [0, 1) drawn per link from the run's seed; the last
    term grows with the number of links being set up at the same moment, the
    load effect that makes setup slow at scale.
    """

    base_s: float
    jitter_s: float
    per_concurrent_link_s: float


@dataclass(frozen=True)
class Preset:
    """A hardware preset. Figures are vendor-published values (sources in docs/fidelity.md)."""

    name: str
    description: str
    max_npus_per_supernode: int
    intra: LinkClass
    inter: LinkClass
    peak_flops: float
    efficiency: float
    hbm_bytes: int
    hbm_Bps: float
    storage_Bps: float
    link_setup: LinkSetupModel


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="atlas-800t-a2",
            description="Atlas 800T A2 server: 8 Ascend 910B NPUs on an HCCS full mesh, RoCE out",
            max_npus_per_supernode=8,
            # HCCS on 910B: 56 GB/s per peer link; RoCE 200 Gb/s per NPU.
            intra=LinkClass(INTRA, latency_s=2e-6, bandwidth_Bps=56e9),
            inter=LinkClass(INTER, latency_s=10e-6, bandwidth_Bps=25e9),
            peak_flops=313e12,  # 910B, FP16 dense
            efficiency=0.4,
            hbm_bytes=64 * 2**30,
            hbm_Bps=1.6e12,
            storage_Bps=5e9,
            link_setup=LinkSetupModel(base_s=2.0, jitter_s=1.0, per_concurrent_link_s=0.02),
        ),
        Preset(
            name="atlas-900-a3",
            description="Atlas 900 A3 SuperPoD / CloudMatrix384: up to 384 Ascend 910C on UB",
            max_npus_per_supernode=384,
            # UB about 392 GB/s per NPU one way; RoCE 400 Gb/s per NPU.
            intra=LinkClass(INTRA, latency_s=1e-6, bandwidth_Bps=392e9),
            inter=LinkClass(INTER, latency_s=10e-6, bandwidth_Bps=50e9),
            peak_flops=752e12,  # 910C, BF16 dense
            efficiency=0.4,
            hbm_bytes=128 * 10**9,
            hbm_Bps=3.2e12,
            storage_Bps=10e9,
            link_setup=LinkSetupModel(base_s=2.0, jitter_s=1.0, per_concurrent_link_s=0.02),
        ),
        Preset(
            name="dgx-h100",
            description="NVIDIA DGX/HGX H100: 8 H100 SXM GPUs on NVLink, InfiniBand out (Llama 3's cluster)",
            max_npus_per_supernode=8,
            # NVLink 4: 900 GB/s per GPU both ways; ConnectX-7: 400 Gb/s per GPU (H100 datasheet)
            intra=LinkClass(INTRA, latency_s=2e-6, bandwidth_Bps=450e9),
            inter=LinkClass(INTER, latency_s=10e-6, bandwidth_Bps=50e9),
            peak_flops=989e12,  # H100 SXM, BF16 dense (1,979 with sparsity)
            efficiency=0.4,
            hbm_bytes=80 * 2**30,
            hbm_Bps=3.35e12,
            # the storage Meta built for Llama 3's 16K GPUs: Tectonic, 2 TB/s sustained ("The Llama 3
            # Herd of Models", section 3.3.1); a job of a few servers would see far less
            storage_Bps=2e12,
            link_setup=LinkSetupModel(base_s=2.0, jitter_s=1.0, per_concurrent_link_s=0.02),
        ),
    )
}


@dataclass(frozen=True)
class Topology:
    """Supernodes x NPUs of one preset."""

    preset: Preset
    supernodes: int
    npus_per_supernode: int

    @property
    def world(self) -> int:
        """Number of NPUs (ranks)."""
        return self.supernodes * self.npus_per_supernode

    def supernode_of(self, rank: int) -> int:
        """The supernode that holds ``rank``."""
        return rank // self.npus_per_supernode

    def ranks_of(self, supernode: int) -> list[int]:
        """The ranks inside ``supernode``."""
        first = supernode * self.npus_per_supernode
        return list(range(first, first + self.npus_per_supernode))

    def link(self, src: int, dst: int) -> LinkClass:
        """The class of the directed link ``src -> dst``."""
        same = self.supernode_of(src) == self.supernode_of(dst)
        return self.preset.intra if same else self.preset.inter
