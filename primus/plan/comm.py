"""Collective times of a parallel layout: which links each group crosses, and the ring cost model.

Ranks are laid out as Megatron-LM and TorchTitan lay them out: tensor parallel fastest, then
context, then data (and expert groups inside tp x cp x dp), then pipeline. A group of ``n`` ranks
whose members sit ``stride`` ranks apart stays inside one node when ``n x stride <= gpus_per_node``;
otherwise its ring crosses the network, and each device's NIC is the bottleneck link.

Cost of one collective on ``n`` ranks (nccl-tests' bus-bandwidth definitions; ``size`` as nccl-tests:
the full buffer, each rank holding ``size / n`` for all-gather output / reduce-scatter input)::

    all-reduce       2 (n-1) * latency + size * 2 (n-1)/n / bw
    all-gather       (n-1) * latency   + size * (n-1)/n / bw
    reduce-scatter   (n-1) * latency   + size * (n-1)/n / bw
    all-to-all       (n-1) * latency   + size * (n-1)/n / bw     (size: one rank's send buffer)
    send/recv        latency           + size / bw

``bw`` is the link's nominal per-direction bandwidth times the profile's link efficiency; across
nodes, ``k`` ranks of the group on one node share the reduction (hierarchical), see ``link``.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus.plan.profiles import DeviceProfile


@dataclass(frozen=True)
class Group:
    """One communicator: ``size`` ranks, ``stride`` apart in the global rank order."""

    size: int
    stride: int

    def crosses_nodes(self, gpus_per_node: int) -> bool:
        return self.size > 1 and self.size * self.stride > gpus_per_node


def link(profile: DeviceProfile, group: Group, gpus_per_node: int) -> tuple[float, float]:
    """(bandwidth in bytes/s, latency in s) the group's collective sees per rank.

    Across nodes, NCCL/RCCL reduce inside each node first (NVLink / Infinity Fabric), so each of the
    group's ``k`` ranks on a node sends only ``1/k`` of the data over its own NIC: the network looks
    ``k`` times faster, up to the intra-node link."""
    eff = profile.efficiency
    intra = profile.intra_node_gbps * 1e9 * eff.intra_link
    if group.crosses_nodes(gpus_per_node):
        per_node = max(1, min(group.size, gpus_per_node // group.stride)) if group.stride < gpus_per_node else 1
        return min(intra, per_node * profile.inter_node_gbps * 1e9 * eff.inter_link), profile.inter_latency_s
    return intra, profile.intra_latency_s


_STEPS = {"allreduce": lambda n: 2 * (n - 1), "allgather": lambda n: n - 1, "reducescatter": lambda n: n - 1,
          "alltoall": lambda n: n - 1, "sendrecv": lambda n: 1}
_WIRE = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
         "reducescatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n, "sendrecv": lambda n: 1.0}


def collective_seconds(op: str, size_bytes: float, group: Group, profile: DeviceProfile,
                       gpus_per_node: int) -> float:
    """Seconds for one ``op`` of ``size_bytes`` on ``group`` (0 for a group of one)."""
    n = group.size
    if n <= 1 or size_bytes <= 0:
        return 0.0
    if op == "reducescatter" and profile.reduce_scatter_as_allreduce:
        op = "allreduce"  # gloo: the whole buffer is all-reduced, each rank keeps its slice
    bandwidth, latency = link(profile, group, gpus_per_node)
    return _STEPS[op](n) * latency + size_bytes * _WIRE[op](n) / bandwidth


@dataclass(frozen=True)
class Groups:
    """The communicators of a layout, with Megatron-LM's rank order (tp, cp, dp, pp)."""

    tp: Group
    cp: Group
    dp: Group  # data parallel (x cp for the gradient reduction of dense weights, see ``grad``)
    grad: Group  # dense-weight gradients: dp x cp ranks
    ep: Group  # expert all-to-all
    expert_grad: Group  # expert-weight gradients: the expert-data-parallel ranks
    pp: Group

    @classmethod
    def of(cls, *, tp: int, cp: int, dp: int, pp: int, ep: int, etp: int) -> "Groups":
        expert_dp = max(1, tp * cp * dp // (ep * etp))
        return cls(tp=Group(tp, 1), cp=Group(cp, tp), dp=Group(dp, tp * cp), grad=Group(dp * cp, tp),
                   ep=Group(ep, etp), expert_grad=Group(expert_dp, etp * ep), pp=Group(pp, tp * cp * dp))
