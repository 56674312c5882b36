"""Reading a scenario file: every problem at once, each with its line and a fix.

:func:`load_scenario` reads a YAML file and returns a frozen
:class:`~testbed.scenario.model.Scenario`, or raises :class:`ScenarioError`
listing every problem, each as ``file:line: field.path: what is wrong; how to
fix it``. The sections are read from their declarations
(:mod:`testbed.scenario.sections`); the faults by their kinds.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from faults.kind import ClusterFacts, FaultKind, FaultSpec, Problems, kinds
from faults.targets import blast_problems
from faults.triggers import as_step, trigger_problems
from testbed.core.errors import ScenarioError
from testbed.job.estimate import job_mtbf_s
from testbed.job.fit import cluster_problem, job_memory_problems, virtual_stages_problem
from testbed.job.models import MODELS, ModelShape
from testbed.scenario.checker import Checker
from testbed.scenario.expect import Expect
from testbed.scenario.integrity_fit import integrity_problems
from testbed.scenario.job_section import JobSection
from testbed.scenario.model import SEED_MAX, VERSION, ClusterSpec, Policy, Safeguards, Scenario
from testbed.scenario.preemption_ladder import notice_problems
from testbed.scenario.reference_run import reference_problems
from testbed.scenario.sections import build
from testbed.scenario.sections import workload as workload_of
from testbed.scenario.serve_section import ServeSection
from testbed.scenario.source import Path as YPath
from testbed.scenario.source import load
from testbed.scenario.timeout_ladder import ladder_warnings
from testbed.serve.estimate import serve_estimate
from testbed.serve.proxy import ProxyShape
from testbed.topology.layout import AXES, Layout, placement_warnings

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_TAG = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
_TOP = (
    "version",
    "name",
    "description",
    "seed",
    "cluster",
    "workload",
    "policy",
    "faults",
    "expect",
    "safeguards",
    "tags",
    "job",
    "serve",
)


def _faults(c: Checker, raw: Any, facts: ClusterFacts, blast_cap: float) -> tuple[FaultSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        c.problem(("faults",), "expected a list of faults, each a mapping with kind, target and at")
        return ()
    registry = kinds()
    out: list[FaultSpec] = []
    for i, entry in enumerate(raw):
        path: YPath = ("faults", i)
        kind = entry.get("kind") if isinstance(entry, dict) else None
        kind = kind if isinstance(kind, str) else repr(kind)
        extra = tuple(registry[kind].params) if kind in registry else ()
        m = c.mapping(entry, path, ("kind", "target", "at", *extra))
        if kind not in registry:
            near = difflib.get_close_matches(str(kind), registry, n=1)
            hint = f" Did you mean '{near[0]}'?" if near else ""
            c.problem(
                (*path, "kind"),
                f"unknown fault kind '{kind}'. Known kinds: {', '.join(sorted(registry))}.{hint}",
            )
            continue
        target: dict[str, Any] = m["target"] if isinstance(m.get("target"), dict) else {}
        at: dict[str, Any] = m["at"] if isinstance(m.get("at"), dict) else {}
        params = {k: m[k] for k in registry[str(kind)].params if k in m}
        spec = FaultSpec(index=i, kind=str(kind), target=dict(target), at=dict(at), params=params)
        spec = replace(spec, occurrence=sum(1 for s in out if s.content() == spec.content()))
        for sub, message in _fault_problems(registry[str(kind)], spec, facts, blast_cap):
            c.problem((*path, *sub), message)
        out.append(spec)
    return tuple(out)


def _fault_problems(kind: FaultKind, spec: FaultSpec, facts: ClusterFacts, blast_cap: float) -> Problems:
    """The shared trigger's problems, the kind's own, and the blast-radius cap's."""
    problems = trigger_problems(spec, facts)
    for name in sorted(({"every", "time"} & set(spec.at)) - set(kind.triggers)):
        problems.append((("at", name), f"{kind.name} fires only at 'step: N' (it acts on a checkpoint)"))
    view = as_step(spec, facts) if not problems else replace(spec, at={"step": 1})
    problems += kind.validate(view, facts)
    if not problems and kind.targets_ranks:
        problems += blast_problems(spec, facts, blast_cap)
    return problems


def _tags(c: Checker, raw: Any) -> tuple[str, ...]:
    """``tags``: short lower-case labels (``smoke``, ``fast``, ``checkpoint``)."""
    if raw is None:
        return ()
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not all(isinstance(t, str) and _TAG.match(t) for t in names):
        c.problem(
            ("tags",),
            f"tags are a list of short lower-case labels (letters, digits, '-', '_'), like [smoke, fast]; "
            f"got {raw!r}",
        )
        return ()
    return tuple(dict.fromkeys(names))


def _job_layout_fits(c: Checker, layout: Layout, run: Layout, model: ModelShape) -> bool:
    """A job's layout is at least the workload's on every axis, has a real group (a workload degree
    of 2 or more) for every axis it parallelises, and no more stages than the model has layers."""
    smaller = [a for a in AXES if layout.degree(a) < run.degree(a)]
    unreal = [a for a in AXES if layout.degree(a) > 1 and run.degree(a) == 1]
    where, fix = ("job", "parallel"), "or leave parallel out to model the workload's layout"
    if smaller:
        c.problem(
            where,
            f"the job's {layout.describe()} is smaller than the {run.describe()} its NPUs run on "
            f"({', '.join(smaller)}); give the job at least the workload's degree on every axis, {fix}",
        )
    elif unreal:
        c.problem(
            where,
            f"the job's {layout.describe()} parallelises {', '.join(unreal)} but its NPUs run "
            f"{run.describe()}: no group of theirs would stand for the job's, and its time would be lost; "
            f"give the workload a degree of 2 or more on {', '.join(unreal)}, {fix}",
        )
    elif layout.pp > model.layers:
        c.problem(
            where,
            f"pp {layout.pp} is more pipeline stages than {model.name}'s {model.layers} layers; "
            f"give at most {model.layers}",
        )
    return not (smaller or unreal or layout.pp > model.layers)


def _job(c: Checker, top: dict[str, Any], cluster: ClusterSpec, run: Layout) -> JobSection:
    """``job``: its fields, a layout at least as large as the one its NPUs run, a global batch that
    the micro-batches of every replica divide, a pipeline split that covers the model, and NPUs that
    hold every stage."""
    before = len(c.problems)
    job: JobSection = build(c, JobSection, top.get("job"), ("job",))
    if len(c.problems) > before:  # the figures below would be built on defaults
        return job
    layout = job.layout(run)
    if not _job_layout_fits(c, layout, run, MODELS[job.model]):
        return job
    per_step = job.micro_batch * layout.dp * layout.ep
    if job.global_batch % per_step:
        c.problem(
            ("job", "global_batch"),
            f"a global batch of {job.global_batch} does not split into micro-batches of {job.micro_batch} "
            f"over {layout.dp * layout.ep} replicas (dp x ep); make it a multiple of {per_step}",
        )
    layers = MODELS[job.model].layers
    built = job.job(run, cluster.topology().preset)
    interleaving, placement = virtual_stages_problem(built), cluster_problem(built)
    if job.stages and (len(job.stages) != layout.pp or sum(job.stages) != layers):
        c.problem(
            ("job", "stages"),
            f"{list(job.stages)} gives {len(job.stages)} stages of {sum(job.stages)} layers; {job.model} "
            f"has {layers} layers over pp {layout.pp}: give {layout.pp} counts that add up to {layers}",
        )
    elif interleaving:
        c.problem(("job", "virtual_stages"), interleaving)
    elif placement:
        c.problem(("job", "cluster"), placement)
    elif not c.problems:
        for problem in job_memory_problems(built):
            c.problem(("job", "stages") if job.stages else ("job",), problem)
    return job


def _job_rate(c: Checker, raw: Any, job: JobSection | None, run: Layout, cluster: ClusterSpec) -> Any:
    """The faults with ``at: {mtbf: job}`` given the modelled job's MTBF in seconds (its NPUs times
    one NPU's rate, :func:`testbed.job.estimate.job_mtbf_s`)."""
    if not isinstance(raw, list):
        return raw
    for i, fault in enumerate(raw):
        at = fault.get("at") if isinstance(fault, dict) else None
        if not (isinstance(at, dict) and at.get("mtbf") == "job"):
            continue
        if job is None:
            c.problem(
                ("faults", i, "at", "mtbf"),
                "mtbf: job takes the job section's failure rate; add a job section, or give a duration "
                "like 3600 or '3h'",
            )
        else:
            at["mtbf"] = job_mtbf_s(job.job(run, cluster.topology().preset))
    return raw


#: the most requests a serving scenario's stream may draw (each is real work in the proxy)
MAX_REQUESTS = 100_000


def _serve(c: Checker, top: dict[str, Any], cluster: ClusterSpec) -> ServeSection:
    """``serve``: its fields, and a tensor-parallel degree that divides the instance and the model's
    heads."""
    serve: ServeSection = build(c, ServeSection, top.get("serve"), ("serve",))
    heads = MODELS[serve.model].heads
    if serve.npus % serve.tp or heads % serve.tp:
        c.problem(
            ("serve", "tp"),
            f"TP {serve.tp} must divide the instance's {serve.npus} NPUs and {serve.model}'s {heads} heads; "
            "pick a divisor of both",
        )
    world = cluster.supernodes * cluster.npus_per_supernode
    if not c.problems and serve.kv_blocks is None:
        e = serve_estimate(serve.deployment(cluster.topology().preset), 1, serve.context, 1, 1.0)
        if e.kv_tokens < serve.block_tokens:
            c.problem(
                ("serve",),
                f"{serve.model}'s weights take {e.weight_bytes / 2**30:.1f} GiB of each NPU's "
                f"{e.deployment.npu.hbm_bytes / 2**30:.1f} GiB and leave no room for a KV cache; split them "
                "over more NPUs (tp), use int8, or give kv_blocks",
            )
    if serve.stream is not None:
        for problem in serve.stream.spec().problems():
            c.problem(("serve", "stream"), problem)
        expected = serve.stream.rate * serve.stream.horizon_s + sum(b.count for b in serve.stream.bursts)
        if expected > MAX_REQUESTS:
            c.problem(
                ("serve", "stream"),
                f"rate x horizon and the bursts give about {expected:,.0f} requests; a rehearsal serves at "
                f"most {MAX_REQUESTS:,}: lower the rate or shorten the horizon",
            )
        if serve.instances * serve.ranks_per_instance > world:
            c.problem(
                ("serve", "instances"),
                f"{serve.instances} instances of {serve.ranks_per_instance} NPU process(es) need "
                f"{serve.instances * serve.ranks_per_instance} and the cluster has {world}; give fewer "
                "instances or ranks_per_instance, or a larger cluster",
            )
    if serve.autoscale is not None and serve.autoscale.min > serve.instances:
        c.problem(
            ("serve", "autoscale", "min"),
            f"autoscale.min {serve.autoscale.min} is more than the {serve.instances} instances, the most "
            "that may run; lower min or raise instances",
        )
    if serve.autoscale is not None and serve.colocation is not None:
        c.problem(
            ("serve", "autoscale"), "autoscaling beside training is not modelled yet; drop one of the two"
        )
    split = serve.disaggregation
    if split is not None and split.prefill >= serve.instances:
        c.problem(
            ("serve", "disaggregation", "prefill"),
            f"{split.prefill} prefill instance(s) of {serve.instances} leave none to decode; give fewer, "
            "or more instances",
        )
    if split is not None and (serve.autoscale is not None or serve.colocation is not None):
        c.problem(
            ("serve", "disaggregation"),
            "disaggregated pools with autoscaling or beside training are not modelled yet; drop one",
        )
    n, width = serve.ranks_per_instance, ProxyShape().width
    moe = MODELS[serve.model].experts > 0
    if serve.npus % n or width % n or (not moe and serve.tp % n):
        c.problem(
            ("serve", "ranks_per_instance"),
            f"ranks_per_instance {n} must divide the instance's {serve.npus} NPUs"
            + ("" if moe else f", its TP {serve.tp}")
            + f" and the proxy's width {width}: the processes stand for the NPUs the model is split over "
            + ("(by TP and EP)" if moe else "(by TP)")
            + "; pick a common divisor",
        )
    return serve


def _serving_faults(
    c: Checker, faults: tuple[FaultSpec, ...], instances: int, ranks_per_instance: int
) -> None:
    """A serving run takes the faults that strike it (``serves``), each at a virtual time on an
    instance's rank (a link's, at least one end), and keeps at least one instance alive (a kill of
    any rank of an instance's TP group loses the instance)."""
    ranks_served = instances * ranks_per_instance
    ending = [f.target.get("rank") for f in faults if kinds()[f.kind].serves and kinds()[f.kind].ends_process]
    killed = {rank // ranks_per_instance for rank in ending if isinstance(rank, int)}
    if killed and len(killed) >= instances:
        c.problem(
            ("faults",),
            f"the faults kill all {instances} serving instance(s) and their requests would have nowhere "
            "to go; keep at least one instance alive, or add instances",
        )
    for f in faults:
        where = ("faults", f.index)
        ranks = f.target.get("link") if "link" in f.target else [f.target.get("rank")]
        if not kinds()[f.kind].serves:
            serving = ", ".join(sorted(k for k, kind in kinds().items() if kind.serves))
            c.problem((*where, "kind"), f"{f.kind} does not strike a serving run yet; use {serving}")
        elif "time" not in f.at:
            c.problem((*where, "at"), "a serving run's fault fires at a virtual time: at: {time: 12s}")
        elif not any(isinstance(r, int) and 0 <= r < ranks_served for r in ranks or []):
            c.problem(
                (*where, "target"),
                f"target {f.target} reaches no serving instance; give {{rank: R}} (a link: an end R) "
                f"with R below {ranks_served}",
            )


def _defaulted_sections(c: Checker, top: dict[str, Any], cluster: ClusterSpec, workload: Any) -> None:
    """When a problem was found and the cluster or the workload section is not written, say that its
    defaults were used (a problem may come from them) and how to write the section."""
    if "cluster" not in top:
        c.problem(
            ("cluster",),
            f"not written, so the problems above were judged against the default cluster ({cluster.preset}, "
            f"{cluster.supernodes} supernodes x {cluster.npus_per_supernode} NPUs); add a 'cluster:' "
            "section, like cluster: {preset: atlas-800t-a2, supernodes: 2, npus_per_supernode: 8}",
        )
    if "workload" not in top:
        c.problem(
            ("workload",),
            f"not written, so the problems above were judged against the default workload ({workload.name}, "
            f"{workload.steps} steps, {workload.layout().describe()}); add a 'workload:' section, like "
            "workload: {name: mlp, steps: 100, parallel: {dp: 16}}",
        )


def parse_scenario(text: str, file: str = "<scenario>") -> Scenario:
    """Validate a scenario document; raises :class:`ScenarioError` with every problem found."""
    src = load(text, file)
    c = Checker(src, Path(file).parent)
    c.nonfinite()
    for path, _ in src.duplicates:
        c.problem(path, "this key appears twice in its mapping; keep one")
    top = c.mapping(src.data, (), _TOP)
    if src.data is None or not isinstance(src.data, dict):
        c.problem((), "the file holds no scenario; start from scenarios/quickstart.yaml")
    if top.get("version") != VERSION:
        c.problem(
            ("version",), f"version must be {VERSION} (got {top.get('version')!r}); add 'version: {VERSION}'"
        )
    name = top.get("name")
    if name is None:
        c.problem(("name",), "no name: add 'name: my-job' (1-64 letters, digits, '.', '_' or '-')")
        name = "unnamed"
    elif not isinstance(name, str) or not _NAME.match(name):
        c.problem(("name",), f"name must be 1-64 letters, digits, '.', '_' or '-' (got {name!r})")
        name = "unnamed"
    seed = c.number(top, "seed", (), 0, 0, SEED_MAX, integer=True)
    cluster = build(c, ClusterSpec, top.get("cluster"), ("cluster",))
    workload = workload_of(c, top.get("workload"), cluster)
    policy = build(c, Policy, top.get("policy"), ("policy",))
    safeguards = build(c, Safeguards, top.get("safeguards"), ("safeguards",))
    job = _job(c, top, cluster, workload.layout()) if "job" in top else None
    serve = _serve(c, top, cluster) if "serve" in top else None
    faults = _faults(
        c,
        _job_rate(c, top.get("faults"), job, workload.layout(), cluster),
        ClusterFacts(
            world=cluster.supernodes * cluster.npus_per_supernode,
            steps=workload.steps,
            topology=cluster.topology(),
            checkpoint_every=policy.checkpoint.every,
        ),
        safeguards.blast_radius_percent,
    )
    if serve is not None and serve.stream is not None and serve.colocation is None:
        _serving_faults(c, faults, serve.instances, serve.ranks_per_instance)
    for path, message in integrity_problems(policy, workload.layout(), workload.name):
        c.problem(path, message)
    expect = build(c, Expect, top.get("expect"), ("expect",))
    tags = _tags(c, top.get("tags"))
    if c.problems:
        _defaulted_sections(c, top, cluster, workload)
        c.refuse()
    scenario = Scenario(
        version=VERSION,
        name=name,
        seed=seed,
        cluster=cluster,
        workload=workload,
        policy=policy,
        faults=faults,
        expect=expect,
        safeguards=safeguards,
        description=str(top.get("description", "")),
        tags=tags,
        job=job,
        serve=serve,
        lines={str(k[0]): v for k, v in src.lines.items() if len(k) == 1},
        file=file,
        warnings=(
            *placement_warnings(workload.layout(), cluster.topology()),
            *ladder_warnings(policy.timeouts, policy.detection),
        ),
    )
    for path, message in (*notice_problems(scenario), *reference_problems(scenario)):
        c.problem(path, message)
    if c.problems:
        c.refuse()
    return scenario


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate the scenario file at ``path``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"{p}: cannot read the scenario file ({exc}); check the path"
        raise ScenarioError(msg) from None
    return parse_scenario(text, str(p))
