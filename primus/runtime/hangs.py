"""Which rank a hung job waits for: read every rank's hang dump, name the one missing.

Each rank's watchdog (``primus.runtime.watchdog``) writes ``hang.json`` into its log folder: its
last step, its phase, and per process group the last collective it entered (torch's flight
recorder: sequence number, op, sizes, completed or not). The ranks still waiting sit in an
incomplete collective; a rank that never entered it has a lower sequence number on that group
and is not waiting in any collective itself — that is the rank the others wait for.

``HangWatch`` runs in the launcher of node 0 (it survives a rank 0 stuck holding the
interpreter): it collects the dumps, prints the one ``hang: rank R …`` line, records it in
metrics.jsonl and writes the verdict that the ranks wait for before they exit.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DUMP = "hang.json"  # per rank, in logs/{module}/rank-{r}/
STACKS = "hang-stacks.txt"  # per rank: the Python stack of every thread
VERDICT = "hang-verdict.json"  # in logs/{module}/: the launcher's verdict, which the ranks wait for
COLLECT_S = 5.0  # after the first dump, how long the launcher waits for the others


def summarise(flight_record: dict[str, Any] | None, groups: dict[str, list[int]]) -> dict[str, dict[str, Any]]:
    """Per process group this rank belongs to: the last collective it entered (flight recorder)."""
    summary = {name: {"ranks": ranks, "last_seq": 0, "op": None, "sizes": None, "completed": True}
               for name, ranks in groups.items() if len(ranks) > 1}  # a group of one never waits for a peer
    for entry in (flight_record or {}).get("entries", []):
        if entry.get("is_p2p"):
            continue
        name, desc = (list(entry.get("process_group") or ["?", ""]) + [""])[:2]
        seq = int(entry.get("collective_seq_id") or 0)
        group = summary.setdefault(name, {"ranks": [], "last_seq": 0, "op": None, "sizes": None, "completed": True})
        if seq >= group["last_seq"]:
            group.update(last_seq=seq, op=entry.get("profiling_name"), sizes=entry.get("input_sizes"), desc=desc,
                         completed=bool(entry.get("retired")) or entry.get("state") == "completed")
    return summary


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) if len(ranks) <= 8 else f"{', '.join(map(str, ranks[:8]))} and {len(ranks) - 8} more"


def analyse(dumps: dict[int, dict[str, Any]], world_size: int, where: str) -> dict[str, Any]:
    """The verdict: the rank(s) the others wait for, and the one line that says so."""
    silent = sorted(set(range(world_size)) - set(dumps))
    waiting_in: dict[str, tuple[int, dict[str, Any]]] = {}  # group -> (seq, what) the others wait in
    for dump in dumps.values():
        for name, group in dump.get("groups", {}).items():
            if not group["completed"] and group["last_seq"] >= waiting_in.get(name, (-1, {}))[0]:
                waiting_in[name] = (group["last_seq"], group)
    blocked = {rank for rank, dump in dumps.items()
               if any(not g["completed"] for g in dump.get("groups", {}).values()) or dump.get("phase") == "comm"}
    culprits: dict[int, tuple[str, dict[str, Any]]] = {}
    for name, (seq, group) in waiting_in.items():
        members = sorted({r for d in dumps.values() for r in d.get("groups", {}).get(name, {}).get("ranks", [])})
        for rank in members:
            mine = dumps.get(rank, {}).get("groups", {}).get(name)
            if rank in dumps and rank not in blocked and (mine is None or mine["last_seq"] < seq):
                culprits.setdefault(rank, (name, group))
    if not culprits and blocked:  # no flight recorder: a rank outside communication while others wait in it
        culprits = {rank: ("", {}) for rank in dumps if rank not in blocked}
    step = max((d.get("last_step") or 0 for d in dumps.values()), default=0)
    verdict: dict[str, Any] = {"event": "hang", "ranks": sorted(culprits), "silent": silent,
                               "waiting": sorted(blocked), "last_step": step}
    if culprits:
        rank = min(culprits)
        name, group = culprits[rank]
        others = sorted(blocked)
        host = dumps[rank].get("host", "?")
        more = f" (and rank {_ranks(sorted(culprits)[1:])})" if len(culprits) > 1 else ""
        desc = f" ({group['desc']})" if group.get("desc") else ""
        collective = f"{group['op']} #{group['last_seq']} of process group {name}{desc}" if name else "the collective"
        line = (f"hang: rank {rank} ({host}){more} never entered {collective} that rank {_ranks(others)} "
                f"wait{'s' if len(others) == 1 else ''} in; it is in {dumps[rank].get('phase') or 'no phase'} "
                f"after step {dumps[rank].get('last_step')}")
    elif silent and dumps:
        line = (f"hang: rank {_ranks(silent)} wrote no dump (stuck holding the interpreter, or on a node whose run "
                f"dir is not shared) while rank {_ranks(sorted(dumps))} stopped after step {step}")
    else:
        line = (f"hang: no rank is missing from a collective: rank {_ranks(sorted(dumps))} stopped after step {step} "
                "(collectives in a different order on different ranks, or a stall outside communication)")
    verdict["line"] = f"{line}; stacks and last collectives in {where}"
    return verdict


def read_dumps(rank_dirs: Path, since: float) -> dict[int, dict[str, Any]]:
    """Each rank's dump newer than ``since`` (an older one belongs to an earlier attempt)."""
    dumps = {}
    for path in rank_dirs.glob(f"rank-*/{DUMP}"):
        try:
            if path.stat().st_mtime >= since:
                dump = json.loads(path.read_text())
                dumps[int(dump["rank"])] = dump
        except (OSError, ValueError, KeyError):
            continue  # being written: read it on the next look
    return dumps


class HangWatch:
    """In node 0's launcher while its workers run: from the first rank's dump, waits ``COLLECT_S``
    for the others (or all of them), then says the verdict and writes it for the ranks."""

    def __init__(self, log_dir: Path, world_size: int, say: Callable[[str], None],
                 record: Callable[[dict[str, Any]], None], poll_s: float = 0.5):
        self.log_dir, self.world_size, self.say, self.record, self.poll_s = log_dir, world_size, say, record, poll_s
        self.verdict: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="primus-hang-watch", daemon=True)

    def __enter__(self) -> "HangWatch":
        self.since = time.time() - 1  # filesystem times may be coarse
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        first_seen = None
        while not self._stop.wait(self.poll_s):
            dumps = read_dumps(self.log_dir, self.since)
            if not dumps:
                continue
            first_seen = first_seen or time.monotonic()
            if len(dumps) < self.world_size and time.monotonic() - first_seen < COLLECT_S:
                continue
            where = f"{self.log_dir}/rank-*/{{{DUMP},{STACKS}}}"
            self.verdict = analyse(dumps, self.world_size, where)
            self.say(self.verdict["line"])
            (self.log_dir / VERDICT).write_text(json.dumps(self.verdict, indent=1))
            self.record(self.verdict)
            return
