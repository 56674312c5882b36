"""The timeout ladder: each detector must give up before the one above it.

From the bottom: the RDMA retransmission window must end before link setup
gives up, link setup before a collective's execution timeout, that before
the framework's process-group timeout; and a heartbeat must come more often
than the silence that declares a node dead. A rung out of order means the
wrong detector fires first (a process group torn down while HCCL would
still have retried, say). Each violation is a warning naming both values
and where each comes from.

Sources: HCCL_RDMA_TIMEOUT is an exponent, a retransmit waiting 4.096 us x
2^value (20: about 4.3 s), retried HCCL_RDMA_RETRY_CNT times (default 7);
HCCL_CONNECT_TIMEOUT takes effect with 20 s of grace; torch_npu's process
group timeout is ``init_process_group(timeout=...)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from testbed.scenario.model import DetectionPolicy, TimeoutPolicy

#: HCCL applies the connect timeout with this much grace.
CONNECT_GRACE_S = 20.0


def rdma_retransmit_s(exponent: int) -> float:
    """One RDMA retransmission timeout: 4.096 us x 2^HCCL_RDMA_TIMEOUT (the InfiniBand local ACK
    timeout encoding, IBTA spec vol. 1, 9.7.6.1.3)."""
    return 4.096e-6 * 2.0**exponent


def ladder_warnings(t: TimeoutPolicy, d: DetectionPolicy | None) -> list[str]:
    """One warning per rung of the timeout ladder that is out of order."""
    out: list[str] = []
    window = rdma_retransmit_s(t.rdma_timeout) * t.rdma_retry_cnt
    connect = t.connect_s + CONNECT_GRACE_S
    rdma = (
        f"the RDMA retry window {window:.4g} s (HCCL_RDMA_TIMEOUT {t.rdma_timeout}: "
        f"{rdma_retransmit_s(t.rdma_timeout):.3g} s a retransmit, x HCCL_RDMA_RETRY_CNT {t.rdma_retry_cnt}; "
        "policy.timeouts.rdma_timeout, rdma_retry_cnt)"
    )
    link = f"the link-setup limit {connect:g} s (policy.timeouts.connect_s {t.connect_s:g} + 20 s HCCL grace)"
    exec_ = f"the exec timeout {t.exec_s:g} s (policy.timeouts.exec_s, HCCL_EXEC_TIMEOUT)"
    if window >= connect:
        out.append(f"timeout ladder: {rdma} is not below {link}; lower the RDMA timeout or raise connect_s")
    if connect >= t.exec_s:
        out.append(f"timeout ladder: {link} is not below {exec_}; raise exec_s or lower connect_s")
    if t.pg_timeout_s is not None and t.exec_s >= t.pg_timeout_s:
        out.append(
            f"timeout ladder: {exec_} is not below the process-group timeout {t.pg_timeout_s:g} s "
            "(policy.timeouts.pg_timeout_s, init_process_group(timeout=...)): the framework would tear the "
            "group down before HCCL reports; raise pg_timeout_s or lower exec_s"
        )
    if d is not None and d.missed <= 1:
        out.append(
            f"timeout ladder: the heartbeat interval {d.heartbeat_s:g} s (policy.detection.heartbeat_s) is "
            f"not below the heartbeat timeout {d.timeout_s:g} s (x missed {d.missed}): one late "
            "beat declares the node dead; set missed to 3 (MindCluster's default)"
        )
    return out
