"""One rank of a resume audit: a fresh interpreter that runs the program for one stretch of steps.

``python -m testbed.audit.rank_process FD``: the driver started it with the
thread counts at 1 and ``PYTHONHASHSEED`` pinned, and holds the other end of
the socketpair ``FD``. It imports the program's module (warm, waiting in the
driver's pool), then takes one job: open the data plane, build the program,
load a checkpoint through the program's own ``load`` if told to, and run
steps. At each step boundary it sends every leaf of the program's state; it
saves where told, and SIGKILLs itself at the armed kill point. Python's and
numpy's global generators are seeded before the program is imported, so a
program that draws from them unseeded is still the same run after run.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from testbed.audit.line import receive, send
from testbed.collectives import Communicator, Endpoint
from testbed.core.errors import TestbedError
from testbed.core.secret import RunSecret
from testbed.fabric.clock import RankClock
from testbed.fabric.dataplane import DataPlane
from testbed.topology.presets import PRESETS, Topology
from workloads.program import ProgramError, average_gradients, build, call, load_factory
from workloads.state_leaves import leaves

#: the preset whose link and compute rates time the audit's virtual clock
PRESET = "atlas-900-a3"


class Killed(BaseException):
    """Never raised: the process is gone. Only for the type checker's sake."""


class RankRun:
    """The job of one rank process: its data plane, its program, its steps."""

    def __init__(self, conn: Connection, job: dict[str, Any]) -> None:
        self.conn, self.job = conn, job
        self.rank, self.world = int(job["rank"]), int(job["world"])
        self.entry = str(job["entry"])
        kill = job.get("kill") or {}
        self.kill_step, self.kill_point = kill.get("step"), kill.get("point")
        self.step = int(job["first"])
        self._dying = threading.Lock()
        self.last_saved = 0  # the boundary of this rank's latest save
        self.committed = 0  # the latest commit the driver told this (armed) rank of

    # --- dying ----------------------------------------------------------------------------------
    def die(self, point: str, detail: str = "") -> None:
        """SIGKILL this process, after telling the driver where (once, from whichever thread)."""
        if not self._dying.acquire(blocking=False):
            time.sleep(60)  # the other thread is killing the process
        send(self.conn, {"kind": "dying", "step": self.step, "point": point, "detail": detail})
        os.kill(os.getpid(), signal.SIGKILL)
        raise Killed  # pragma: no cover

    def point(self, name: str) -> None:
        """Die here if this is the armed kill point of the current step."""
        if self.kill_point == name and self.kill_step == self.step:
            self.wait_committed(self.last_saved)
            self.die(name)

    def wait_committed(self, boundary: int) -> None:
        """Wait for the driver's word that the checkpoint after ``boundary`` steps is committed: a kill
        comes after every rank's save before it, so the case resumes from the same step every run."""
        while self.committed < boundary:
            self.committed = max(self.committed, int(receive(self.conn)["boundary"]))

    def _hook(self, point: str) -> None:
        # a step that only accumulates gradients has no reduction: the kill waits for the next one
        armed = self.kill_point == "mid_reduction" and self.kill_step is not None
        if point == "allreduce.mid" and armed and self.step >= int(self.kill_step or 0):
            self.wait_committed(self.last_saved)
            self.die(
                "mid_reduction", "" if self.step == self.kill_step else f"armed at step {self.kill_step}"
            )

    # --- the run ----------------------------------------------------------------------------------
    def phase(self, name: str) -> None:
        """Tell the driver which call of the program runs now (it names a hang by it)."""
        send(self.conn, {"kind": "phase", "step": self.step, "phase": name})

    def connect(self) -> Communicator:
        """Open this rank's data plane, trade addresses through the driver, and form the group."""
        job = self.job
        plane = DataPlane(
            self.rank,
            RunSecret(bytes.fromhex(job["secret"])),
            guard_s=float(job["guard_s"]),
            socket_dir=job["socket_dir"],
            world=self.world,
        )
        self.plane = plane
        send(self.conn, {"kind": "address", "address": list(plane.address)})
        addresses = {int(r): tuple(a) for r, a in receive(self.conn)["addresses"].items()}
        topology = Topology(PRESETS[PRESET], 1, self.world)
        self.ep = Endpoint(self.rank, plane, RankClock(), topology, seed=int(job["seed"]), hook=self._hook)
        self.ep.new_epoch(int(job["epoch"]), addresses)
        return Communicator(self.ep, "replica", list(range(self.world)))

    def report(self, kind: str, program: Any, **extra: Any) -> None:
        """Send the leaves of the program's state now."""
        try:
            state = leaves(program.statefuls)
        except Exception as exc:
            raise ProgramError(f"entry {self.entry!r}: reading a state_dict() raised {exc!r}") from None
        send(self.conn, {"kind": kind, "step": self.step, "leaves": state, **extra})

    def run(self) -> None:
        """Build, load if told to, run the steps; then wait for the driver's word to leave."""
        job = self.job
        group = self.connect()
        self.phase("factory")
        program = build(self.entry, self.rank, self.world, int(job["seed"]), job.get("options") or {})
        if job.get("resume"):
            self.phase("load")
            call(self.entry, "load()", program.load, str(Path(job["resume"]) / f"rank_{self.rank:05d}"))
            self.report("loaded", program)
        elif self.step == 0:
            self.report("boundary", program, loss=None, t=0.0)
        preset = PRESETS[PRESET]
        while self.step < int(job["last"]):
            self.point("before_forward")
            self.phase("forward_backward")
            self.ep.step = self.step
            self.ep.clock.compute(float(job["flops"]), preset.peak_flops, preset.efficiency)
            loss = call(self.entry, "forward_backward()", program.forward_backward)
            grads = call(self.entry, "gradients()", program.gradients)
            if not hasattr(grads, "keys"):
                raise ProgramError(f"entry {self.entry!r}: gradients() returned a {type(grads).__name__}")
            self.point("after_backward")
            if grads:
                self.phase("gradient reduction")
                average_gradients(self.entry, group, grads)
            self.phase("optimizer_step")
            call(self.entry, "optimizer_step()", program.optimizer_step)
            self.point("after_step")
            boundary = self.step + 1
            value = None if loss is None else float(loss)
            self.report("boundary", program, loss=value, t=self.ep.clock.t, boundary=boundary)
            if boundary in job["saves"]:
                self.save(program, boundary)
            self.step = boundary
        send(self.conn, {"kind": "done", "step": self.step})
        while receive(self.conn).get("kind") != "leave":
            pass  # leave only when every rank is done: peers may still read our frames
        self.plane.close()

    def save(self, program: Any, boundary: int) -> None:
        """The program's own save into this rank's folder of the checkpoint's temporary directory."""
        folder = Path(self.job["root"]) / f"step_{boundary:08d}.tmp" / f"rank_{self.rank:05d}"
        folder.mkdir(parents=True, exist_ok=True)
        armed = self.kill_point == "in_save" and self.kill_step == self.step
        self.phase("save")
        if armed:
            self.wait_committed(self.last_saved)
            threading.Thread(target=self._kill_mid_write, args=(folder,), daemon=True).start()
            sys.setprofile(self._kill_after_first_write)
        try:
            call(self.entry, "save()", program.save, str(folder))
        finally:
            sys.setprofile(None)
        if armed:
            self.die("in_save", "save() had returned; killed before the checkpoint was committed")
        files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
        if not files:
            raise ProgramError(
                f"entry {self.entry!r}: save({str(folder)!r}) returned having written no file there; "
                "write the checkpoint into the folder it is given"
            )
        send(self.conn, {"kind": "saved", "step": self.step, "boundary": boundary, "files": files})
        self.last_saved = boundary
        if self.kill_point == "after_save" and self.kill_step == self.step:
            self.wait_committed(boundary)
            self.die("after_save", f"after the checkpoint of step {boundary} was committed")

    def _kill_after_first_write(self, frame: Any, event: str, arg: Any) -> None:
        # inside the save, once a write call of any library (file.write, numpy's, PyTorch's writer)
        # has returned: the checkpoint is begun and not finished
        if event == "c_return" and "write" in getattr(arg, "__name__", ""):
            sys.setprofile(None)
            self.die("in_save", f"mid-write: inside save(), after its first {arg.__name__}() returned")

    def _kill_mid_write(self, folder: Path) -> None:
        while True:  # die as soon as the save has put bytes on disk, while it is still writing
            begun = [p for p in folder.rglob("*") if p.is_file() and p.stat().st_size > 0]
            if begun:
                self.die("in_save", f"mid-write: {len(begun)} file(s) begun")
            time.sleep(0.0005)


def main() -> None:
    """``python -m testbed.audit.rank_process FD``: serve the line ``FD``; never returns."""
    serve(int(sys.argv[1]))


def serve(fd: int) -> None:
    """Take the hello (the program to import) and one job on the line ``fd``; report what goes wrong
    on it; end the process (never returns)."""
    conn = Connection(fd)
    hello = receive(conn)
    sys.path[:0] = [p for p in hello["sys_path"] if p not in sys.path]
    random.seed(0)
    np.random.seed(0)
    code = 0
    try:
        t0 = time.perf_counter()
        load_factory(str(hello["entry"]))
        send(conn, {"kind": "ready", "pid": os.getpid(), "import_s": time.perf_counter() - t0})
        try:
            job = receive(conn)
        except EOFError:
            return
        RankRun(conn, job).run()
    except ProgramError as exc:
        send(conn, {"kind": "error", "message": exc.message, "program": True})
        code = 1
    except TestbedError as exc:
        send(conn, {"kind": "error", "message": exc.message, "fabric": True})
        code = 1
    except (EOFError, BrokenPipeError, ConnectionError):
        code = 1  # the driver is gone
    except Exception as exc:
        send(conn, {"kind": "error", "message": f"{type(exc).__name__}: {exc}", "internal": True})
        code = 1
    finally:
        sys.stdout.flush()
        os._exit(code)


if __name__ == "__main__":
    main()
