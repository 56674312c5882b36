"""The driver's side of the rank processes: a pool of new processes, and one stretch of a run.

Every rank of every stretch, a restarted one included, is a new process: none
is reused, so none keeps hidden state across a restart. By default each is
forked from the :mod:`zygote <testbed.audit.zygote>`, an interpreter that
imported numpy and PyTorch and did nothing else (milliseconds per rank); with
``start="fresh"`` each is a fresh interpreter of its own (about a second of
CPU each with PyTorch). Either way the pool starts the next stretch's
processes while the current one runs: each waits, its program's module
imported, for a job.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any

import psutil

from testbed.audit.line import receive, send
from testbed.audit.plan import AuditPlan
from testbed.audit.store import commit
from testbed.core.secret import RunSecret
from testbed.fabric.listeners import private_folder
from workloads.program import ProgramError

#: what every rank process is started with: one thread per library, the hash seed pinned
RANK_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "PYTHONHASHSEED": "0",
}

#: wall seconds a process may take to start and import the program before it counts as stuck
START_S = 120.0


#: how rank processes start: forked from the zygote, or each a fresh interpreter
STARTS = ("zygote", "fresh")


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@dataclass
class RankProcess:
    """One rank process and the driver's end of its line (``popen`` when the driver started it
    itself, None when the zygote forked it)."""

    pid: int
    conn: Connection
    popen: subprocess.Popen[bytes] | None = None
    rank: int = -1
    phase: tuple[int, str] = (0, "start")
    done: bool = False
    gone: bool = False

    def running(self) -> bool:
        """Whether the process still runs."""
        return self.popen.poll() is None if self.popen is not None else _running(self.pid)

    def wait(self, timeout: float) -> None:
        """Wait (bounded) for the process to end."""
        deadline = time.monotonic() + timeout
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.005)

    def kill(self) -> None:
        """SIGKILL it (by its pid: only processes this pool started) and reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.wait(10)
        self.conn.close()


class RankPool:
    """Fresh rank processes, started ahead of need, each with the program's module imported."""

    def __init__(self, entry: str, log: IO[bytes], needed: int | None = None, start: str = "zygote") -> None:
        """``needed``: how many processes the whole audit takes (none is started beyond it);
        ``start``: one of :data:`STARTS`."""
        self.entry, self.log = entry, log
        self.needed, self.start = needed, start
        self._zygote: tuple[subprocess.Popen[bytes], socket.socket] | None = None
        self.waiting: list[RankProcess] = []
        self.started = 0
        self.zygote_s = 0.0  # seconds the zygote took to import numpy and PyTorch
        #: seconds each process took to import the program's module (PyTorch with it, if it uses it)
        self.import_s: list[float] = []

    def _spawn(self, module: str, fd: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", module, str(fd)],
            pass_fds=[fd],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            env={**os.environ, **RANK_ENV},
        )

    def _zygote_line(self) -> socket.socket:
        if self._zygote is None:
            line, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            popen = self._spawn("testbed.audit.zygote", theirs.fileno())
            theirs.close()
            line.settimeout(START_S)
            self._zygote = (popen, line)
            t0 = time.perf_counter()
            if line.recv(16) != b"ready":
                raise ProgramError("the zygote that forks the rank processes ended at start; see ranks.log")
            self.zygote_s = time.perf_counter() - t0
        return self._zygote[1]

    def _start(self) -> RankProcess:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.start == "fresh":
            fresh = self._spawn("testbed.audit.rank_process", theirs.fileno())
            popen: subprocess.Popen[bytes] | None = fresh
            pid = fresh.pid
        else:
            line, popen = self._zygote_line(), None
            socket.send_fds(line, [b"spawn"], [theirs.fileno()])
            pid = int(line.recv(32))
        theirs.close()
        proc = RankProcess(pid, Connection(mine.detach()), popen)
        send(proc.conn, {"entry": self.entry, "sys_path": [os.getcwd(), *sys.path]})
        self.started += 1
        return proc

    def fill(self, count: int) -> None:
        """Have ``count`` processes starting or waiting."""
        while len(self.waiting) < count and (self.needed is None or self.started < self.needed):
            self.waiting.append(self._start())

    def take(self, count: int) -> list[RankProcess]:
        """``count`` ready processes (the program's module imported); the pool starts as many again."""
        self.fill(count)
        while len(self.waiting) < count:  # past what was needed: start them anyway
            self.waiting.append(self._start())
        taken, self.waiting = self.waiting[:count], self.waiting[count:]
        try:
            for proc in taken:
                if not proc.conn.poll(START_S):
                    raise ProgramError(f"a rank process did not start within {START_S:.0f} s")
                msg = _receive(proc)
                if msg.get("kind") != "ready":
                    raise ProgramError(str(msg.get("message") or "a rank process ended at start"))
                self.import_s.append(float(msg.get("import_s") or 0.0))
        except BaseException:
            for proc in taken:
                proc.kill()
            raise
        self.fill(count)
        return taken

    def close(self) -> None:
        """End every waiting process, and the zygote (which ends every child it forked)."""
        for proc in self.waiting:
            proc.kill()
        self.waiting = []
        if self._zygote is not None:
            popen, line = self._zygote
            line.close()
            try:
                popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(timeout=10)
            self._zygote = None


def _receive(proc: RankProcess) -> dict[str, Any]:
    try:
        return receive(proc.conn)
    except (EOFError, OSError):
        proc.gone = True
        proc.wait(1.0)
        code = proc.popen.poll() if proc.popen is not None else None
        ended = "its process ended" + (f" (exit code {code})" if code is not None else "")
        return {"kind": "gone", "message": ended}


@dataclass
class Segment:
    """What one stretch of a run told the driver."""

    #: boundary (steps done) -> rank -> the leaves of the program's state there
    boundaries: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)
    losses: dict[int, dict[int, float | None]] = field(default_factory=dict)
    times: dict[int, dict[int, float]] = field(default_factory=dict)
    #: rank -> the leaves right after the program's load (a resumed stretch)
    loaded: dict[int, dict[str, Any]] = field(default_factory=dict)
    resumed_at: int | None = None
    #: the armed kill, as the dying rank told it (rank, step, point, detail)
    death: dict[str, Any] | None = None
    committed: list[int] = field(default_factory=list)
    wall_s: float = 0.0


@dataclass
class Stretch:
    """Where a stretch starts and what is armed in it."""

    seed: int
    root: Path
    first: int = 0
    resume: Path | None = None
    kill: dict[str, Any] | None = None  # {"rank", "step", "point"}
    epoch: int = 0


def run_segment(pool: RankPool, plan: AuditPlan, stretch: Stretch) -> Segment:
    """Run ``stretch`` on fresh processes to the plan's last step, or to its armed kill. The ranks'
    unix sockets go in a folder of the stretch's own, removed after it: a rank killed at its armed
    point never removes its socket itself."""
    t0 = time.monotonic()
    procs = pool.take(plan.ranks)
    out = Segment(resumed_at=stretch.first if stretch.resume else None)
    sockets = private_folder("tb-audit-")
    try:
        _start_jobs(procs, plan, stretch, sockets)
        _drive(procs, plan, stretch, out)
    finally:
        for proc in procs:
            if not proc.gone or proc.running():
                proc.kill()
        shutil.rmtree(sockets, ignore_errors=True)
    out.wall_s = time.monotonic() - t0
    return out


def _start_jobs(procs: list[RankProcess], plan: AuditPlan, stretch: Stretch, sockets: str) -> None:
    secret = RunSecret.new().key.hex()
    saves = [b for b in range(stretch.first + 1, plan.steps) if plan.saves_at(b)]
    stretch.root.mkdir(parents=True, exist_ok=True)
    for rank, proc in enumerate(procs):
        proc.rank = rank
        kill = stretch.kill if stretch.kill and stretch.kill["rank"] == rank else None
        send(
            proc.conn,
            {
                "entry": plan.entry,
                "rank": rank,
                "world": plan.ranks,
                "seed": stretch.seed,
                "options": dict(plan.options),
                "first": stretch.first,
                "last": plan.steps,
                "saves": saves,
                "root": str(stretch.root),
                "resume": str(stretch.resume) if stretch.resume else None,
                "kill": kill,
                "secret": secret,
                "guard_s": plan.timeout_s,
                "socket_dir": sockets,
                "flops": plan.flops,
                "epoch": stretch.epoch,
            },
        )
    addresses: dict[str, Any] = {}
    for proc in procs:
        msg = _receive(proc) if proc.conn.poll(plan.timeout_s) else {"kind": "silent"}
        if msg.get("kind") != "address":
            raise ProgramError(f"rank {proc.rank}: {msg.get('message') or 'no data-plane address'}")
        addresses[str(proc.rank)] = msg["address"]
    for proc in procs:
        send(proc.conn, {"addresses": addresses})


def _drive(procs: list[RankProcess], plan: AuditPlan, stretch: Stretch, out: Segment) -> None:
    """Read every rank's messages until all are done or the armed kill fired; commit checkpoints."""
    saved: dict[int, set[int]] = {}
    selector = selectors.DefaultSelector()
    for each in procs:
        selector.register(each.conn.fileno(), selectors.EVENT_READ, each)
    last_word = time.monotonic()
    try:
        while not all(p.done or p.gone for p in procs):
            ready = selector.select(timeout=1.0)
            if not ready and time.monotonic() - last_word > plan.timeout_s:
                where = "; ".join(f"rank {p.rank} in {p.phase[1]} of step {p.phase[0]}" for p in procs)
                raise ProgramError(
                    f"the program made no progress for {plan.timeout_s:g} s ({where}): it hangs, or a "
                    "step takes longer than timeout_s allows; raise timeout_s if it is only slow"
                )
            for key, _ in ready:
                proc = key.data
                msg = _receive(proc)
                last_word = time.monotonic()
                if proc.gone:
                    selector.unregister(key.fd)
                    if out.death is not None and out.death["rank"] == proc.rank:
                        return  # the armed kill fired; the others are killed by the caller
                    if stretch.kill is None or proc.rank == stretch.kill["rank"]:
                        raise ProgramError(
                            f"rank {proc.rank}: {msg['message']} in {proc.phase[1]} of step "
                            f"{proc.phase[0]}, not at an armed kill point"
                        )
                    continue  # a peer of the rank about to die, which it told first
                _handle(msg, proc, procs, plan, stretch, out, saved)
    finally:
        selector.close()
    if stretch.kill is not None:
        raise ProgramError(
            f"the kill armed at {stretch.kill['point']} of step {stretch.kill['step']} on rank "
            f"{stretch.kill['rank']} never fired: the run ended before reaching it"
        )
    for proc in procs:
        send(proc.conn, {"kind": "leave"})
    for proc in procs:
        proc.wait(plan.timeout_s)


def _handle(
    msg: dict[str, Any],
    proc: RankProcess,
    procs: list[RankProcess],
    plan: AuditPlan,
    stretch: Stretch,
    out: Segment,
    saved: dict[int, set[int]],
) -> None:
    kind, rank = msg.get("kind"), proc.rank
    if kind == "phase":
        proc.phase = (int(msg["step"]), str(msg["phase"]))
    elif kind == "boundary":
        b = int(msg.get("boundary", msg["step"]))
        out.boundaries.setdefault(b, {})[rank] = msg["leaves"]
        out.losses.setdefault(b, {})[rank] = msg.get("loss")
        out.times.setdefault(b, {})[rank] = float(msg.get("t") or 0.0)
    elif kind == "loaded":
        out.loaded[rank] = msg["leaves"]
    elif kind == "saved":
        b = int(msg["boundary"])
        saved.setdefault(b, set()).add(rank)
        if len(saved[b]) == plan.ranks:
            commit(stretch.root, b, plan.ranks)
            out.committed.append(b)
            kill = stretch.kill
            if kill:  # the armed rank waits for the commit of its latest save before it dies
                with contextlib.suppress(OSError):
                    send(procs[kill["rank"]].conn, {"kind": "committed", "boundary": b})
    elif kind == "dying":
        out.death = {"rank": rank, **{k: msg[k] for k in ("step", "point", "detail")}}
    elif kind == "done":
        proc.done = True
    elif kind == "error":
        if stretch.kill is not None and msg.get("fabric") and rank != stretch.kill["rank"]:
            return  # a peer of the rank being killed noticed it: expected
        raise ProgramError(f"rank {rank}, step {proc.phase[0]}: {msg['message']}")
