"""``allreduce(buf, out=...)``: the result written into a buffer the caller owns, ``out=buf`` in place,
with the same bits as a new array, for every algorithm, large payloads (the lane, folded) included."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from testbed.collectives import Communicator
from testbed.collectives.ops import f32_to_bf16
from testbed.collectives.select import OFFERED
from tests.fabric import run_group, topology

#: float32 elements per rank: large enough that the ring's chunks take the lane in pieces
LARGE = 3 * 200_000


@pytest.mark.parametrize("algo", OFFERED["allreduce"])
@pytest.mark.parametrize(
    ("op", "bf16", "length"), [("sum", False, 7), ("avg", False, LARGE), ("max", True, 300)]
)
def test_in_place_gives_the_same_bits_as_a_new_array(algo: str, op: str, bf16: bool, length: int) -> None:
    topo = topology(2, 2)  # two supernodes of two: every algorithm fits

    def program(c: Communicator) -> Any:
        values = np.random.default_rng(c.rank).uniform(0.5, 2.0, length).astype(np.float32)
        mine = f32_to_bf16(values) if bf16 else values
        fresh = c.allreduce(mine, op=op, algo=algo, bf16=bf16)
        buf = mine.copy()
        placed = c.allreduce(buf, op=op, algo=algo, bf16=bf16, out=buf)
        other = np.empty_like(mine)
        into = c.allreduce(mine, op=op, algo=algo, bf16=bf16, out=other)
        return fresh, placed is buf, buf, into is other, other

    res = run_group(topo, [0, 1, 2, 3], program)
    for r in range(4):
        out = res[r][0]
        assert not isinstance(out, Exception), out
        fresh, is_buf, buf, is_other, other = out
        assert is_buf and is_other
        assert fresh.tobytes() == buf.tobytes() == other.tobytes() == res[0][0][0].tobytes()
