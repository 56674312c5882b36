"""Test helper, run as a process: write a 2-rank checkpoint and SIGKILL itself at a chosen point.

``python tests/ckpt_writer.py ROOT STEP SEED POINT RANK``: ``POINT`` is
``shard.mid`` (half of ``RANK``'s first file written), ``manifest.written``,
``renamed`` or ``none``.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.train import checkpoint as ckpt


def arrays(seed: int, rank: int) -> dict[str, dict[str, np.ndarray]]:
    """What rank ``rank`` saves: two components of seeded arrays."""
    rng = np.random.default_rng([seed, rank])
    return {
        "params": {"w": rng.standard_normal((64, 32)).astype(np.float32)},
        "optimizer": {"m": rng.standard_normal(2048).astype(np.float32), "t": np.asarray(seed)},
    }


def main() -> None:
    root, step, seed, point, victim = (
        Path(sys.argv[1]),
        int(sys.argv[2]),
        int(sys.argv[3]),
        sys.argv[4],
        int(sys.argv[5]),
    )

    def die_at(rank: int) -> ckpt.Hook:
        def hook(where: str) -> None:
            if where == point and rank == victim:
                os.kill(os.getpid(), signal.SIGKILL)

        return hook

    tmp = ckpt.step_dir(root, step, tmp=True)
    entries = {str(r): ckpt.write_shard(tmp, r, arrays(seed, r), die_at(r)) for r in (0, 1)}
    ckpt.commit(root, step, {"step": step, "ranks": entries}, die_at(victim))


if __name__ == "__main__":
    main()
