"""The line between the audit's driver and one rank process: JSON messages over a socketpair.

A socketpair has no address another process could connect to, and JSON
runs no code when read: nothing on this line needs a secret.
"""

from __future__ import annotations

import json
from multiprocessing.connection import Connection
from typing import Any

#: the largest message either side reads (a program's leaves at one step stay far below it)
MAX_MESSAGE = 64 << 20


def send(conn: Connection, message: dict[str, Any]) -> None:
    """Send one message."""
    conn.send_bytes(json.dumps(message, separators=(",", ":")).encode())


def receive(conn: Connection) -> dict[str, Any]:
    """Receive one message (``EOFError`` when the other side is gone)."""
    message = json.loads(conn.recv_bytes(MAX_MESSAGE))
    if not isinstance(message, dict):
        raise ValueError("a message on an audit line is a JSON object")
    return message
