"""What a job costs, derived from its description: memory per NPU, the step's time and its parts,
the message sizes of its collectives, its checkpoint. Every formula names its source.

The step is timed as nothing overlaps (a conservative bound that the run
then checks): compute at ``peak x efficiency``, the 1F1B pipeline bubble
``(p - 1) / m`` of it, ``(p - 1) / (v m)`` interleaved over ``v`` model chunks
per rank (Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", sections 2.2.1-2.2.2), and each
collective by the alpha-beta cost of the algorithm the run picks for it, on
the link class it crosses (Thakur, Rabenseifner and Gropp 2005, "Optimization
of Collective Communication Operations in MPICH"; the closed forms are the
collectives' own, which a contention-free run meets exactly): a ring
allreduce of ``n`` bytes over ``p`` ranks costs
``2 (p - 1) alpha + 2 (p - 1) / p n / beta``.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.collectives import closed_form
from testbed.job.spec import ACTIVATION_BYTES, GRAD_BYTES, OPTIMIZER_BYTES, WEIGHT_BYTES, Job
from testbed.topology.layout import Coords
from testbed.topology.presets import Topology

#: Bytes per activation value the loss keeps of the logits (FP32 for a stable softmax).
LOGIT_BYTES = 4


def gib(n: float) -> str:
    """``n`` bytes in GiB to a tenth (what an NPU's HBM is counted in; negative for a shortfall)."""
    return f"{n / 2**30:.1f} GiB"


@dataclass(frozen=True)
class StageMemory:
    """Device bytes of one NPU of pipeline stage ``stage`` (the most loaded TP/EP slice)."""

    stage: int
    layers: int
    weights: int
    grads: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        """All of it."""
        return self.weights + self.grads + self.optimizer + self.activations


@dataclass(frozen=True)
class Collective:
    """One kind of collective of a step: how many per step, bytes each, seconds in all."""

    name: str
    group: int
    count: int
    nbytes: int
    algo: str
    link: str
    seconds: float


@dataclass(frozen=True)
class StepTime:
    """One step's time, part by part (virtual seconds)."""

    compute_s: float
    bubble_s: float
    collectives: tuple[Collective, ...]

    @property
    def comm_s(self) -> float:
        """All collectives (none overlapped)."""
        return sum(c.seconds for c in self.collectives)

    @property
    def total_s(self) -> float:
        """The step."""
        return self.compute_s + self.bubble_s + self.comm_s


def _stage_ranges(job: Job) -> list[range]:
    out, start = [], 0
    for n in job.stage_layers():
        out.append(range(start, start + n))
        start += n
    return out


def stage_params(job: Job, stage: int) -> tuple[int, int]:
    """(dense, routed-expert) weights one NPU of ``stage`` holds: dense ones split over TP, experts
    over EP and TP; the input embedding on the first stage, the output head and last norm on the
    last (vocabulary-parallel over TP)."""
    m, lay = job.model, job.layout
    layers = _stage_ranges(job)[stage]
    dense = experts = 0
    for i in layers:
        moe = m.experts > 0 and i >= m.dense_layers
        total = m.layer_params(moe)
        routed = m.experts * m.expert_params() if moe else 0
        dense += total - routed
        experts += routed
    if stage == 0:
        dense += m.vocab * m.hidden
    if stage == lay.pp - 1:
        dense += m.vocab * m.hidden + m.hidden
    return dense // lay.tp, experts // (lay.ep * lay.tp)


def layer_activations(job: Job) -> int:
    """Bytes one transformer layer keeps per micro-batch on one NPU, tensor and sequence parallel
    (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
    section 4): ``s b h (34 + 5 a s / h) / t``; selective recomputation drops the ``5 a s / h``
    term, full recomputation keeps only the layer's input, ``2 s b h / t``."""
    m, t = job.model, job.layout.tp
    sbh = job.seq * job.micro_batch * m.hidden
    if job.recompute == "full":
        return ACTIVATION_BYTES * sbh // t
    per = 34 * sbh
    if job.recompute == "none":
        per += 5 * m.heads * job.seq * job.seq * job.micro_batch
    return per // t


def in_flight_layers(job: Job, stage: int) -> float:
    """Layers' worth of one micro-batch's activations ``stage`` holds at its fullest. Under 1F1B
    stage ``i`` holds ``min(p - i, m)`` micro-batches of its layers (Narayanan et al. 2021);
    interleaved over ``v`` chunks it holds ``(v - 1) p + 2 (p - i - 1) + 1`` chunks of ``1 / v``
    of them, at most ``v m`` (Megatron-LM's warm-up, ``schedules.py``): on the first stage
    ``1 + (p - 1) / (p v)`` times the model's layers (Korthikanti et al. 2022, section 4.2.3)."""
    p, v, m = job.layout.pp, job.virtual_stages, job.micro_batches
    layers = job.stage_layers()[stage]
    if v == 1:
        return float(min(p - stage, m) * layers)
    return min((v - 1) * p + 2 * (p - stage - 1) + 1, v * m) * layers / v


def memory(job: Job) -> list[StageMemory]:
    """Device bytes per NPU, stage by stage: its weights, gradients and optimizer shard, and the
    activations of :func:`in_flight_layers`; the last stage also the logits of one micro-batch."""
    lay = job.layout
    out = []
    for stage, layers in enumerate(_stage_ranges(job)):
        dense, experts = stage_params(job, stage)
        params = dense + experts
        if job.distributed_optimizer:  # experts are replicated over DP only, the rest over DP x EP
            optimizer = OPTIMIZER_BYTES * (dense // job.replicas + experts // lay.dp)
        else:
            optimizer = OPTIMIZER_BYTES * params
        acts = round(in_flight_layers(job, stage) * layer_activations(job))
        if stage == lay.pp - 1:
            acts += job.seq * job.micro_batch * job.model.vocab * LOGIT_BYTES // lay.tp
        out.append(
            StageMemory(stage, len(layers), WEIGHT_BYTES * params, GRAD_BYTES * params, optimizer, acts)
        )
    return out


def flops_per_npu(job: Job) -> float:
    """Model FLOPs of one NPU per step: the job's (``6 N + 12 L H Q T`` per token) over its NPUs
    (what MFU counts)."""
    return job.model.flops_per_token(job.seq) * job.tokens_per_step / job.world


def hardware_flops_per_npu(job: Job) -> float:
    """FLOPs one NPU computes per step: the model's, and with full recomputation the forward pass
    once more, a third of them (Korthikanti et al. 2022, section 5: 4 passes' worth instead of 3);
    selective recomputation's attention part is left out (a few per cent at these lengths)."""
    return flops_per_npu(job) * (4 / 3 if job.recompute == "full" else 1.0)


def pp_sends(job: Job, stage: int) -> tuple[int, int]:
    """Pipeline sends of one NPU of ``stage`` per step: (activations forward to stage ``s + 1 mod
    p``, gradients back to stage ``s - 1 mod p``). Each of its ``v`` chunks sends both for every
    micro-batch, but the model's last chunk sends no activation on and its first no gradient back;
    interleaved, the last stage's other chunks send on to the first stage and the first stage's
    gradients go back to the last."""
    p, v, m = job.layout.pp, job.virtual_stages, job.micro_batches
    if p == 1:
        return (0, 0)
    return (m * (v - (stage == p - 1)), m * (v - (stage == 0)))


def rank_traffic(job: Job, stage: int) -> dict[str, tuple[float, float]]:
    """(bytes, calls) one NPU of ``stage`` hands per step to each kind of collective (buffer sizes
    summed), by the group it runs in: ``tp`` (four activation allreduces per layer and
    micro-batch), ``pp`` (an activation forward, a gradient back, per micro-batch and model chunk,
    each TP rank its ``1 / t`` of it), ``ep``
    (dispatch and combine, forward and backward, per MoE layer and micro-batch), ``replica`` (the
    dense gradients) and ``dp`` (the experts' gradients). The run times its proxy's collectives
    as these."""
    m, lay, mbs = job.model, job.layout, job.micro_batches
    act = ACTIVATION_BYTES * job.seq * job.micro_batch * m.hidden
    layers = _stage_ranges(job)[stage]
    moe = sum(1 for i in layers if m.experts and i >= m.dense_layers)
    dense, experts = stage_params(job, stage)
    sends = sum(pp_sends(job, stage))
    out = {
        "tp": (4.0 * len(layers) * mbs * act, 4.0 * len(layers) * mbs) if lay.tp > 1 else (0.0, 0.0),
        "pp": (float(sends * (act // lay.tp)), float(sends)),
        "ep": (4.0 * moe * mbs * act * m.top_k, 4.0 * moe * mbs) if lay.ep > 1 else (0.0, 0.0),
        "replica": (float(GRAD_BYTES * dense), 1.0) if job.replicas > 1 else (0.0, 0.0),
        "dp": (float(GRAD_BYTES * experts), 1.0) if lay.dp > 1 else (0.0, 0.0),
    }
    return {k: v for k, v in out.items() if v[0]}


@dataclass(frozen=True)
class RankCollectives:
    """One NPU's collectives of one kind in a step: how many, their bytes, and how long they take
    on an idle fabric as a latency part and a bandwidth part (seconds)."""

    calls: float
    nbytes: float
    latency_s: float
    transfer_s: float
    #: ranks in the job's group
    group: int

    @property
    def per_call(self) -> int:
        """Bytes of one call."""
        return round(self.nbytes / self.calls) if self.calls else 0


#: The collective each group runs (``pp`` sends point to point instead).
GROUP_COLLECTIVE = {
    "tp": "allreduce",
    "ep": "alltoall",
    "replica": "allreduce",
    "dp": "allreduce",
}
#: The axes each group spans.
GROUP_AXES = {"tp": ("tp",), "pp": ("pp",), "ep": ("ep",), "replica": ("dp", "ep"), "dp": ("dp",)}


def job_topology(job: Job, run: Topology) -> Topology:
    """Where the job's NPUs sit: on the supernodes its ``cluster`` declares, else on as many of its
    preset's real supernodes as it fills (384 NPUs on Atlas 900 A3, one 8-NPU server on an Atlas 800T
    A2 or a DGX), whatever the rehearsal's cluster (``run``: its preset only) looks like: a TP group
    of 8 on Atlas 900 A3 stays on one supernode's UB even when 2 x 4 processes rehearse it."""
    if job.cluster:
        supernodes, per = job.cluster
        return Topology(run.preset, supernodes, per)
    per = run.preset.max_npus_per_supernode
    return Topology(run.preset, -(-job.world // per), per)


def group_placement(job: Job, topo: Topology) -> list[tuple[str, int, str]]:
    """Rank 0's groups on ``topo``: (axis, ranks, where), ``where`` the link class inside a supernode
    or across supernodes (``intra`` or ``inter`` with the preset's link name)."""
    out = []
    for name, axes in (("tp", ("tp",)), ("pp", ("pp",)), ("ep", ("ep",)), ("dp", ("dp", "ep"))):
        ranks = job.layout.group(0, axes)
        if len(ranks) > 1:
            spans = len({topo.supernode_of(r) for r in ranks})
            where = (
                f"across {spans} supernodes ({topo.preset.inter.name})"
                if spans > 1
                else (f"within a supernode ({topo.preset.intra.name})")
            )
            out.append((name, len(ranks), where))
    return out


def job_stage(stage: int, run_pp: int, job_pp: int) -> int:
    """The job's pipeline stage that stage ``stage`` of a ``run_pp``-stage pipeline stands for: first
    for first, last for last, the others spread evenly between (modelled scale)."""
    if run_pp <= 1 or job_pp == run_pp:
        return min(stage, job_pp - 1)
    return round(stage * (job_pp - 1) / (run_pp - 1))


def rank_collectives(
    job: Job, stage: int, topo: Topology, sync_algo: str = "auto"
) -> dict[str, RankCollectives]:
    """Per group, what one NPU of ``stage`` spends on its collectives per step (:func:`rank_traffic`),
    each timed by the closed form of the algorithm the run picks at one call's size, in the
    groups of the stage's first rank on ``topo``; the gradient sync by ``sync_algo`` if named."""
    lay = job.layout
    rank = lay.rank_of(Coords(dp=0, tp=0, pp=stage, ep=0))
    out = {}
    for group, (nbytes, calls) in rank_traffic(job, stage).items():
        per_call = nbytes / calls
        ranks = lay.group(rank, GROUP_AXES[group])
        if group == "pp":  # each direction on its own link (the wrap-around of an interleaved pipeline)
            latency = transfer = 0.0
            for sends, to in zip(pp_sends(job, stage), (stage + 1, stage - 1)):
                if sends:
                    peer = lay.rank_of(Coords(dp=0, tp=0, pp=to % lay.pp, ep=0))
                    lat, tra = closed_form.send_split_s(rank, peer, topo, per_call)
                    latency, transfer = latency + lat * sends, transfer + tra * sends
            out[group] = RankCollectives(calls, nbytes, latency, transfer, len(ranks))
            continue
        algo = sync_algo if group in ("replica", "dp") else "auto"
        _, latency, transfer = closed_form.split_s(GROUP_COLLECTIVE[group], ranks, topo, per_call, algo)
        out[group] = RankCollectives(calls, nbytes, latency * calls, transfer * calls, len(ranks))
    return out


def _stage0_peers(job: Job, ranks: list[int]) -> list[int]:
    """The stages the first stage exchanges with: the next, and interleaved also the last."""
    return [ranks[1]] + ([ranks[-1]] if job.virtual_stages > 1 and len(ranks) > 2 else [])


def _stage0_send_s(job: Job, ranks: list[int], topo: Topology, nbytes: int) -> float:
    """The first stage's mean time per pipeline send: ``v`` of every ``2v - 1`` with the next stage,
    the other ``v - 1`` (interleaved: activations in from, gradients back to the last stage) with
    the last."""
    v = job.virtual_stages
    nxt = closed_form.send_s(ranks[0], ranks[1], topo, nbytes)
    if v == 1 or len(ranks) <= 2:
        return nxt
    wrap = closed_form.send_s(ranks[0], ranks[-1], topo, nbytes)
    return (v * nxt + (v - 1) * wrap) / (2 * v - 1)


def step_time(job: Job, topo: Topology, sync_algo: str = "auto") -> StepTime:
    """The step's compute, bubble and collectives on ``topo`` (rank 0's groups), nothing overlapped;
    each collective by the closed form of the algorithm the run picks at the job's size
    (:mod:`testbed.collectives.closed_form`), the gradient sync by ``sync_algo`` if named."""
    m, lay = job.model, job.layout
    compute = hardware_flops_per_npu(job) / (job.npu.peak_flops * job.efficiency)
    bubble = compute * (lay.pp - 1) / (job.virtual_stages * job.micro_batches)
    mbs = job.micro_batches
    act = ACTIVATION_BYTES * job.seq * job.micro_batch * m.hidden
    deepest = max(job.stage_layers())
    out: list[Collective] = []

    def add(name: str, axes: tuple[str, ...], count: int, nbytes: int, kind: str, algo: str = "auto") -> None:
        ranks = lay.group(0, axes)
        if len(ranks) <= 1 or count == 0:
            return
        if kind == "send":  # to the next stage, and interleaved also to and from the last
            algo, each = "p2p", _stage0_send_s(job, ranks, topo, nbytes)
        else:
            algo, each = closed_form.collective_s(kind, ranks, topo, nbytes, algo)
        p = topo.preset
        link = p.inter.name if len({topo.supernode_of(r) for r in ranks}) > 1 else p.intra.name
        if kind == "send":
            link = " and ".join(sorted({topo.link(ranks[0], r).name for r in _stage0_peers(job, ranks)}))
        if algo == "hierarchical":
            link = f"{p.intra.name} and {p.inter.name}"
        out.append(Collective(name, len(ranks), count, nbytes, algo, link, count * each))

    # Megatron-LM: two allreduces per layer forward and two backward (Shoeybi et al. 2019, section 3)
    add("tp_allreduce", ("tp",), 4 * deepest * mbs, act, "allreduce")
    # every slot of the 1F1B schedule waits for its input: an activation forward, a gradient back
    # each TP rank sends its own 1/t of the activation (Narayanan et al. 2021, section 4.1: the
    # scatter/gather optimisation; sequence-parallel activations are split so already)
    add("pp_send", ("pp",), 2 * (job.virtual_stages * mbs + lay.pp - 1), act // lay.tp, "send")
    moe_layers = sum(1 for i in range(deepest) if m.experts and i >= m.dense_layers)
    # dispatch and combine, forward and backward (GShard, Lepikhin et al. 2020)
    add("ep_alltoall", ("ep",), 4 * moe_layers * mbs, act * m.top_k, "alltoall")
    dense, experts = stage_params(job, 0)
    add("dp_grad_allreduce", ("dp", "ep"), 1, GRAD_BYTES * dense, "allreduce", sync_algo)
    expert_syncs = 1 if experts else 0
    add("dp_expert_grad_allreduce", ("dp",), expert_syncs, GRAD_BYTES * experts, "allreduce", sync_algo)
    return StepTime(compute, bubble, tuple(out))


def checkpoint_bytes(job: Job) -> dict[str, int]:
    """Bytes the whole job writes per checkpoint, by component: the BF16 weights once (data-parallel
    rank 0 of each model shard writes them) and the optimizer state (FP32 master weights, momentum,
    variance) once, sharded or not."""
    params = job.model.params()
    return {"params": WEIGHT_BYTES * params, "optimizer": OPTIMIZER_BYTES * params}
