"""Ray and the data plane listen on 127.0.0.1 only, by default."""

from __future__ import annotations

import ipaddress
import os
import socket

import psutil
import pytest

from testbed.actors.cluster import Cluster
from testbed.actors.session import RaySession
from testbed.control.runner import rank_spec
from testbed.core.secret import RunSecret
from testbed.fabric.dataplane import DATA, DataPlane
from testbed.scenario.parse import parse_scenario

SMALL = """\
version: 1
name: loopback
cluster: {supernodes: 1, npus_per_supernode: 2}
workload: {steps: 2, parallel: {dp: 2}}
"""


def is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


@pytest.mark.ray
def test_every_listening_socket_of_the_instance_is_loopback(ray_session: RaySession) -> None:
    assert ray_session.started, "the test session should own its Ray instance"
    assert ray_session.node_ip == "127.0.0.1"
    cluster = Cluster(rank_spec(parse_scenario(SMALL)))
    try:
        cluster.start()
        assert all(addr[0] == "127.0.0.1" for addr in cluster.addresses.values())
        owned = set(ray_session.owned_pids()) | set(cluster.pids.values())
        listening = [
            c for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN and c.pid in owned
        ]
        assert listening, "found no listening socket of the Ray instance to check"
        outside = [(c.pid, c.laddr) for c in listening if not is_loopback(c.laddr.ip)]
        assert outside == []
        assert {c.pid for c in listening} & set(cluster.pids.values()), "NPU data-plane listeners not seen"
        # peers on this host talk over unix sockets in the cluster's own folder, which stop() removes
        assert all(str(addr[2]).startswith(cluster.socket_dir) for addr in cluster.addresses.values())
        cluster.kill(1, 0.0, 0, "boundary")  # a killed NPU cannot remove its own socket file
    finally:
        cluster.stop()
    assert not os.path.exists(cluster.socket_dir)


def _link_family(a_host: str, b_host: str) -> socket.AddressFamily:
    """The family of the socket rank 1 receives rank 0's frames on, the two listening on these hosts."""
    secret = RunSecret.new()
    a, b = DataPlane(0, secret, a_host, guard_s=10.0), DataPlane(1, secret, b_host, guard_s=10.0)
    try:
        for plane in (a, b):
            plane.new_epoch(1, {0: a.address, 1: b.address})
        a.send(1, DATA, {"tag": "t"}, b"hello")
        a.flush()
        kind, _, payload = b.recv(0, "t")
        assert (kind, bytes(payload)) == (DATA, b"hello")
        return b._inbox[0][1].family
    finally:
        a.close()
        b.close()


def test_ranks_on_one_node_use_the_unix_socket_and_across_nodes_tcp_to_the_nodes_address() -> None:
    assert _link_family("127.0.0.1", "127.0.0.1") == socket.AF_UNIX
    # two Ray nodes of one machine (127.0.0.2 and 127.0.0.3): the frames really cross addresses
    assert _link_family("127.0.0.2", "127.0.0.3") == socket.AF_INET
