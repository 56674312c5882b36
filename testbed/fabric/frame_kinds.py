"""The kinds of a data-plane frame (the first byte of its prefix), apart from the frame format itself.

A supernode actor relays markers of these kinds for its NPUs but never reads a payload: it imports
this module, not :mod:`testbed.fabric.frames`, and so starts without numpy (about 0.14 s of CPU
for each supernode of each run).
"""

from __future__ import annotations

DATA, ABORT, DROP, SETUP_FAIL = 0, 1, 2, 3
#: a frame passing a shared-memory lane's descriptor (:mod:`testbed.fabric.lane`)
LANE = 4
#: every kind a frame may have
KINDS = frozenset({DATA, ABORT, DROP, SETUP_FAIL, LANE})
