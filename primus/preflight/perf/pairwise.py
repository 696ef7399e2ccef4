"""Inter-node bandwidth node by node: pairs of nodes, then a bisection of the slow pairs.

Round 1 pairs the nodes in order (1-2, 3-4, ...); in each pair, local rank k of one node exchanges
``size`` bytes with local rank k of the other in both directions at once (a two-rank sendrecv
ring, every k at the same time, every pair at the same time). An exchange's time is the fastest of
``iters`` (a busy host only ever slows one down: the fastest is the link's), a pair's bandwidth its
slowest local rank's. A pair below the median of the pairs by the margin holds a bad node (or a bad link
between the two): round 2 bisects it, pairing each of its nodes with a node of a healthy pair; the
node that stays slow is the bad one, its partner is cleared. An odd node out is measured in round 2
too. Two rounds whatever the number of nodes (more only when slow pairs outnumber healthy ones).

Every rank runs this (it creates the process groups of each round collectively); the rounds'
results are gathered on every rank, so every rank plans the next round identically.
"""
from __future__ import annotations

import statistics
from typing import Any

from primus.preflight.perf.collectives import operation
from primus.preflight.perf.compute import synchronize


def nodes_of(hosts: dict[int, str]) -> dict[str, list[int]]:
    """Node name -> its ranks, nodes in the order of their first rank."""
    nodes: dict[str, list[int]] = {}
    for rank in sorted(hosts):
        nodes.setdefault(hosts[rank], []).append(rank)
    return nodes


def first_round(names: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Pairs in order, and the node left over (an odd count)."""
    pairs = [(names[i], names[i + 1]) for i in range(0, len(names) - 1, 2)]
    return pairs, names[len(pairs) * 2:]


def slow(values: dict[Any, float], reference: float, margin: float) -> list[Any]:
    return [key for key, value in values.items() if value < reference * (1 - margin)]


def bisect_rounds(suspects: list[str], healthy: list[str]) -> list[list[tuple[str, str]]]:
    """Each suspect paired with a distinct healthy node; more rounds when suspects outnumber them."""
    if not healthy:
        return []
    rounds = []
    for start in range(0, len(suspects), len(healthy)):
        rounds.append(list(zip(suspects[start:start + len(healthy)], healthy)))
    return rounds


class PairRunner:
    """Measures rounds of node pairs on every rank (groups are created collectively, once per rank pair)."""

    def __init__(self, nodes: dict[str, list[int]], rank: int, device: str, size: int, *, warmup: int, iters: int,
                 object_group=None):
        self.nodes, self.rank, self.device, self.size = nodes, rank, device, size
        self.warmup, self.iters, self.object_group = warmup, iters, object_group
        self.local = min(len(ranks) for ranks in nodes.values())
        self.groups: dict[tuple[int, int], Any] = {}

    def _group(self, ranks: tuple[int, int]):
        import torch.distributed as dist

        if ranks not in self.groups:
            self.groups[ranks] = dist.new_group(list(ranks))
        return self.groups[ranks]

    def measure(self, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], float]:
        """GB/s of each pair (its slowest local rank: size / the slower end's seconds per exchange)."""
        import torch.distributed as dist

        mine = None
        for pair in pairs:
            for k in range(self.local):
                ranks = tuple(sorted((self.nodes[pair[0]][k], self.nodes[pair[1]][k])))
                group = self._group(ranks)  # every rank creates every group, in the same order
                if self.rank in ranks:
                    mine = (pair, k, group)
        seconds = self._fastest(mine[2]) if mine is not None else None
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (mine[0], mine[1], seconds) if mine else None, group=self.object_group)
        worst: dict[tuple[str, str], float] = {}
        for item in gathered:
            if item is not None:
                pair, _, secs = item
                worst[tuple(pair)] = max(worst.get(tuple(pair), 0.0), secs)
        return {pair: self.size / worst[pair] / 1e9 for pair in pairs}


    def _fastest(self, group) -> float:
        """Seconds of the fastest of ``iters`` exchanges, after ``warmup`` untimed ones."""
        import time

        import torch.distributed as dist

        exchange = operation("sendrecv", self.size, group, self.device)
        for _ in range(self.warmup):
            exchange()
        times = []
        for _ in range(self.iters):
            dist.barrier(group=group)
            start = time.perf_counter()
            exchange()
            synchronize(self.device)
            times.append(time.perf_counter() - start)
        return min(times)


def run_pairwise(runner: PairRunner, margin: float) -> dict[str, Any]:
    """Round 1 and the bisection; returns every round's pairs and GB/s, and each node's figure."""
    names = list(runner.nodes)
    pairs, left = first_round(names)
    rounds = [{"round": 1, "pairs": _rows(runner.measure(pairs))}]
    first = {tuple(row["nodes"]): row["gbps"] for row in rounds[0]["pairs"]}
    reference = statistics.median(first.values()) if len(first) >= 2 else None
    slow_pairs = slow(first, reference, margin) if reference is not None else []
    suspects = [node for pair in slow_pairs for node in pair] + left
    healthy = [node for pair in first if pair not in slow_pairs for node in pair]
    figures = {node: {"gbps": value, "partner": pair[1 - pair.index(node)], "round": 1}
               for pair, value in first.items() for node in pair if node not in suspects}
    for number, round_pairs in enumerate(bisect_rounds(suspects, healthy), start=2):
        measured = runner.measure(round_pairs)
        rounds.append({"round": number, "pairs": _rows(measured)})
        for (suspect, partner), value in measured.items():
            figures[suspect] = {"gbps": value, "partner": partner, "round": number}
    return {"size": runner.size, "local_ranks": runner.local, "reference_gbps": reference, "rounds": rounds,
            "figures": figures, "slow_pairs": [list(p) for p in slow_pairs],
            "bad": bad_links(first, slow_pairs, left, figures, margin)}


RECOVERY = 2.0  # a suspect that, beside a healthy node, moves twice its slow partner's figure is cleared


def bad_links(first: dict[tuple[str, str], float], slow_pairs: list[tuple[str, str]], left: list[str],
              figures: dict[str, dict[str, Any]], margin: float) -> list[str]:
    """The nodes that stay slow beside a healthy partner, judged against the healthy pairs' median.

    A slow pair's better node is cleared when its own figure is at least ``RECOVERY`` times its old
    partner's: on a busy host the healthy node's re-pair can itself fall below the margin, but it
    stays far above the node that holds the bad link; when both nodes are bad, neither clears the other.
    """
    healthy = [value for pair, value in first.items() if pair not in slow_pairs]
    if not healthy:
        return []
    floor = statistics.median(healthy) * (1 - margin)
    bad = []
    for a, b in slow_pairs:
        for node, other in ((a, b), (b, a)):
            mine, theirs = figures.get(node, {}).get("gbps"), figures.get(other, {}).get("gbps")
            if mine is not None and mine < floor and (theirs is None or mine < RECOVERY * theirs):
                bad.append(node)
    bad += [node for node in left if node in figures and figures[node]["gbps"] < floor]
    return bad


def _rows(measured: dict[tuple[str, str], float]) -> list[dict[str, Any]]:
    return [{"nodes": list(pair), "gbps": value} for pair, value in measured.items()]
