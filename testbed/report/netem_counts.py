"""What the links under netem did, summed from the journal: a pure function of its events.

The sending and receiving ranks count, per ``link_netem`` fault, what the
link did to their messages (:mod:`testbed.collectives.netem_link`); the
journal's ``fault_hits`` events carry the counts as ``<fault id>.<what>``.
The report's ``netem`` field holds one row per such fault, and the summary
one line.
"""

from __future__ import annotations

from typing import Any

from testbed.collectives.netem_link import COUNTED

Event = dict[str, Any]


def netem_counts(events: list[Event]) -> list[dict[str, Any]]:
    """One row per fault that counted netem effects in the main phase: its messages, what was lost,
    corrupted (caught by the checksum, or delivered), duplicated (discarded), reordered, and the
    retransmissions with the virtual seconds they cost."""
    totals: dict[str, dict[str, int]] = {}
    for e in events:
        if e.get("event") != "fault_hits" or e.get("phase") != "main":
            continue
        for key, n in e["hits"].items():
            fid, _, what = str(key).rpartition(".")
            if fid and what in COUNTED:
                row = totals.setdefault(fid, {})
                row[what] = row.get(what, 0) + int(n)
    for e in events:
        if e.get("event") == "fault_hits" and e.get("phase") == "main":
            for fid, row in totals.items():
                row["messages"] = row.get("messages", 0) + int(e["hits"].get(fid, 0))
    rows = []
    for fid, row in sorted(totals.items()):
        out: dict[str, Any] = {"id": fid, "messages": row.get("messages", 0)}
        out.update({what: row.get(what, 0) for what in COUNTED if not what.endswith("_us")})
        out["retransmit_s"] = row.get("retransmit_us", 0) / 1e6
        out["held_s"] = row.get("held_us", 0) / 1e6
        out["delivered_corrupt"] = max(0, out["corrupted"] - out["caught"])
        rows.append(out)
    return rows


def render(rows: list[dict[str, Any]]) -> list[str]:
    """The summary's line for each fault of :func:`netem_counts`."""
    return [
        f"netem {r['id']}: {r['messages']} message(s) sent through it; {r['lost']} lost, "
        f"{r['corrupted']} corrupted ({r['caught']} caught by the receiver's checksum, "
        f"{r['delivered_corrupt']} delivered corrupt), {r['duplicated']} duplicated ({r['discarded']} "
        f"discarded by sequence number), {r['reordered']} reordered (held {r['held_s']:.4g} s); "
        f"{r['retransmits']} retransmit(s) cost {r['retransmit_s']:.4g} s of virtual time"
        + (f"; {r['given_up']} given up after the retry limit" if r["given_up"] else "")
        for r in rows
    ]
