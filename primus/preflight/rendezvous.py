"""Every rank announces itself in a TCPStore; rank 0 waits with a deadline and names who is missing.

``init_process_group`` alone would block until its timeout and then fail without saying
which rank never came. Here each rank writes ``announce/<rank>`` (its host and facts) and
bumps a counter; rank 0 polls the counter until the deadline and, if ranks are missing,
names them and tells the others to stop. The same store then backs the process group.
"""
from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from typing import Any

PREFIX = "primus-preflight"


class RendezvousError(RuntimeError):
    """This rank could not reach rank 0's store, or rank 0 never decided."""


def connect(rank: int, master_addr: str, master_port: int, timeout: float):
    """The job's store: rank 0 hosts it, unless torchrun's agent already does."""
    import torch.distributed as dist

    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    try:
        store = dist.TCPStore(master_addr, master_port, None, rank == 0 and not agent,
                              timedelta(seconds=timeout), wait_for_workers=False)
    except (RuntimeError, OSError) as exc:
        where = f"{master_addr}:{master_port}"
        raise RendezvousError(f"rank {rank} could not reach the store at {where} within {timeout:.0f} s "
                              f"(is rank 0 running, and is MASTER_ADDR reachable from here?): {exc}") from None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    # torchrun's agent store is shared with the agent itself: keep to our own key space.
    return dist.PrefixStore(f"{PREFIX}/attempt_{attempt}/", store)


def announce(store, rank: int, payload: dict[str, Any]) -> None:
    store.set(f"announce/{rank}", json.dumps(payload))
    store.add("announced", 1)


def _poll(store, counter: str, key: str, world_size: int, deadline: float) -> tuple[dict[int, Any], list[int]]:
    while time.monotonic() < deadline and int(store.add(counter, 0)) < world_size:
        time.sleep(0.05)
    present, missing = {}, []
    for rank in range(world_size):
        name = f"{key}/{rank}"
        if store.check([name]):
            present[rank] = json.loads(store.get(name))
        else:
            missing.append(rank)
    return present, missing


def wait_for_announcements(store, world_size: int, timeout: float) -> tuple[dict[int, Any], list[int]]:
    """Rank 0: (payload by rank, missing ranks) once all announced or the deadline passed."""
    return _poll(store, "announced", "announce", world_size, time.monotonic() + timeout)


def decide(store, decision: dict[str, Any]) -> None:
    store.set("decision", json.dumps(decision))


def wait_for_decision(store, timeout: float) -> dict[str, Any]:
    try:
        store.wait(["decision"], timedelta(seconds=timeout))
    except (RuntimeError, OSError) as exc:
        raise RendezvousError(f"rank 0 gave no go-ahead within {timeout:.0f} s: {exc}") from None
    return json.loads(store.get("decision"))


def publish_result(store, rank: int, payload: dict[str, Any]) -> None:
    store.set(f"result/{rank}", json.dumps(payload))
    store.add("results", 1)


def gather_results(store, world_size: int, timeout: float) -> tuple[dict[int, Any], list[int]]:
    return _poll(store, "results", "result", world_size, time.monotonic() + timeout)


def acknowledge(store) -> None:
    store.add("acks", 1)


def wait_for_acks(store, expected: int, timeout: float) -> None:
    """Rank 0 hosts the store: it waits (briefly) until the others have read the decision."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and int(store.add("acks", 0)) < expected:
        time.sleep(0.05)


def name_missing(missing: list[int], joined_hosts: dict[int, str], ranks_per_node: int | None,
                 node_hosts: list[str] | None) -> dict[int, str]:
    """Where each missing rank was expected: a host from the launcher's list, else a peer of the
    same node that did join, else the node number alone."""
    where = {}
    for rank in missing:
        node = rank // ranks_per_node if ranks_per_node else None
        host = None
        if node is not None and node_hosts and node < len(node_hosts):
            host = node_hosts[node]
        elif node is not None:
            peers = [h for r, h in joined_hosts.items() if r // ranks_per_node == node]
            host = peers[0] if peers else None
        where[rank] = host or (f"node {node}, host unknown" if node is not None else "host unknown")
        if host and node is not None:
            where[rank] = f"{host}, node {node}"
    return where
