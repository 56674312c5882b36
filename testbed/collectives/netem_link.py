"""What really travels on a link under netem (a ``link_netem`` fault), and what the receiver keeps.

The time model and the seeded draws are :mod:`testbed.fabric.netem`; this is
the data path, on the real data plane:

- every message the fault acts on carries its link's sequence number
  (``nseq``) and, when the transport checks, the CRC-32 of its payload
  (``crc``, zlib's);
- a lost transmission sends nothing: the retransmission follows, after the
  retransmit timeout the clock charges;
- a corrupted transmission really travels, one bit flipped at a seeded
  offset, under the clean payload's CRC: the receiver's check fails, it
  discards the copy and reads the clean one that follows;
- a duplicate really travels after the message, and the receiver discards it
  by its sequence number;
- without a checksum (``checksum: false``) the corrupted copy is the one
  delivered: silent data corruption of the real data;
- a reordered message keeps its place on the socket (the transport delivers
  in order): its hold is charged in virtual time only.

Each side counts what it did in the endpoint's ``fault_hits`` under the
fault's id (messages acted on) and ``<id>.<what>`` (:data:`COUNTED`), which
the journal's ``fault_hits`` events carry.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from testbed.collectives.endpoint import Endpoint
from testbed.fabric.dataplane import DATA, DROP
from testbed.fabric.frames import SEQ, Fold, Frame
from testbed.fabric.netem import RETRY_CNT, NetemLink
from testbed.topology.presets import LinkClass

#: the kind of the link-fault records this module acts on
NETEM = "netem"
#: what the sender (lost .. given_up) and the receiver (caught, discarded) count, per fault; times in
#: microseconds (the counts are whole numbers)
COUNTED = (
    "lost",
    "corrupted",
    "duplicated",
    "reordered",
    "retransmits",
    "retransmit_us",
    "held_us",
    "given_up",
    "caught",
    "discarded",
)
#: (epoch, sender, tag) entries of the highest sequence number accepted, kept per receiving rank
SEEN_KEPT = 4096


def count(ep: Endpoint, fault_id: str, what: str, n: int = 1) -> None:
    """Add ``n`` to the counter ``what`` of ``fault_id`` (nothing when ``n`` is 0)."""
    if n:
        key = f"{fault_id}.{what}"
        ep.fault_hits[key] = ep.fault_hits.get(key, 0) + n


def flipped(raw: bytes | memoryview, bit: int) -> bytes:
    """A copy of ``raw`` with bit ``bit`` (counted from the first byte's lowest bit) flipped."""
    out = bytearray(raw)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def in_force(ep: Endpoint, dst: int, t: float) -> bool:
    """Whether a ``link_netem`` fault acts on this rank's link to ``dst`` at ``t``."""
    return bool(ep.faults.on(NETEM, ep.rank, dst, t))


def send(
    ep: Endpoint,
    dst: int,
    data: np.ndarray,
    header: dict[str, Any],
    link: LinkClass,
    nbytes: float,
    calls: float,
    t_send: float,
) -> None:
    """Send ``data`` to ``dst`` through the netem fault in force on the link (``link``: its class as
    the message sees it, degraded or not; ``nbytes``: the modelled bytes)."""
    record = ep.faults.on(NETEM, ep.rank, dst, t_send)[0]
    assert record.netem is not None
    fid, n = record.fault_id, record.netem
    state = ep.netem.get((fid, dst))
    if state is None:
        state = ep.netem[(fid, dst)] = NetemLink(ep.seed, fid, ep.rank, dst)
    start = max(ep.clock.t, ep.clock.egress_free)
    tx = state.transmit(n, start, link.latency_s, link.bandwidth_Bps, nbytes, calls)
    ep.clock.egress_free = tx.egress_free
    ep.fault_hits[fid] = ep.fault_hits.get(fid, 0) + 1
    count(ep, fid, "lost", tx.failed.count("lost"))
    count(ep, fid, "corrupted", tx.failed.count("corrupt") + int(tx.corrupt))
    count(ep, fid, "retransmits", len(tx.failed) - int(tx.given_up))
    count(ep, fid, "retransmit_us", round(tx.retransmit_s * 1e6))
    count(ep, fid, "duplicated", int(tx.duplicate))
    count(ep, fid, "reordered", int(tx.held_s > 0))
    count(ep, fid, "held_us", round(tx.held_s * 1e6))
    drop = ep.faults.dropped(ep.rank, dst, t_send)
    if drop is not None or tx.given_up:
        count(ep, fid, "given_up", int(tx.given_up))
        if drop is not None:
            ep.hit("drop", ep.rank, dst, t_send)
        marker = {"tag": header["tag"], "t": t_send, "fault": fid if drop is None else drop.fault_id}
        if drop is None:
            marker["why"] = (
                f"link {ep.rank}->{dst} lost the message {RETRY_CNT + 1} times ({fid}): the sender's "
                f"NIC gave up after {RETRY_CNT} retransmissions"
            )
        ep.dataplane.send(dst, DROP, marker)
        return
    raw: bytes | memoryview = data.data.cast("B") if data.nbytes else b""
    seq = ep.netem.get(("seq", dst), 0) + 1
    ep.netem[("seq", dst)] = seq
    header.update(arrival=tx.arrival, occupy=tx.occupy, transfer=tx.arrival - start, nf=fid)
    header[SEQ] = seq
    if n.checksum:
        header["crc"] = zlib.crc32(raw)
    for why in tx.failed:
        if why == "corrupt":  # it travels, and the receiver's check turns it away
            ep.dataplane.send(dst, DATA, header, flipped(raw, state.bit(len(raw) * 8)))
    payload = flipped(raw, state.bit(len(raw) * 8)) if tx.corrupt else raw
    ep.dataplane.send(dst, DATA, header, payload)
    if tx.duplicate:
        ep.dataplane.send(dst, DATA, header, payload)


def recv(
    ep: Endpoint, src: int, tag: str, into: memoryview | None, also: str | None, fold: Fold | None = None
) -> Frame:
    """The next frame from ``src`` with ``tag`` (or ``also``), as :meth:`DataPlane.recv` gives it, less
    the copies a netem'd link sent that the transport turns away: a payload whose CRC-32 differs from
    its header's (caught), and a sequence number already accepted on this tag (a duplicate). ``fold``
    as for :meth:`DataPlane.recv` (never for the copies a netem'd link sent)."""
    seen: dict[tuple[int, int, str], int] = ep.netem.get("seen") or {}
    if seen:  # a duplicate that came after the last message of its tag was kept aside: turn it away

        def stale(h: dict[str, Any]) -> bool:
            return SEQ in h and int(h[SEQ]) <= seen.get((ep.dataplane.epoch, src, str(h["tag"])), 0)

        for h in ep.dataplane.discard_kept(src, stale):
            count(ep, str(h.get("nf", "")), "discarded")
    while True:
        kind, header, payload = ep.dataplane.recv(src, tag, into, also=also, fold=fold)
        if kind != DATA or SEQ not in header:
            return kind, header, payload
        fid = str(header.get("nf", ""))
        crc = header.get("crc")
        view = payload.data if isinstance(payload, np.ndarray) else payload
        if crc is not None and zlib.crc32(view) != crc:
            count(ep, fid, "caught")
            continue
        seen = ep.netem.setdefault("seen", {})
        key = (ep.dataplane.epoch, src, str(header["tag"]))
        seq = int(header[SEQ])
        if seq <= seen.get(key, 0):
            count(ep, fid, "discarded")
            continue
        seen[key] = seq
        if len(seen) > SEEN_KEPT:
            del seen[next(iter(seen))]
        return kind, header, payload
