"""Checks, thresholds, options, formulas and rendering, without a process group."""
from __future__ import annotations

import pytest

from primus.config.errors import ConfigError
from primus.preflight.checks import Context, accelerators, environment, experiment, host, network
from primus.preflight.options import PreflightOptions, parse_size
from primus.preflight.perf.collectives import bandwidths, bus_factor, combine
from primus.preflight.perf.stragglers import find_stragglers
from primus.preflight.rendezvous import name_missing
from primus.plan.thresholds import load_thresholds

T = load_thresholds()


def ctx(hosts: dict[int, str], **options) -> Context:
    return Context(len(hosts), T, hosts, options)


def test_cpu_host_reports_no_accelerator():
    facts = {r: {"accelerators": accelerators.collect({})} for r in range(2)}  # this CI machine has no GPU
    found = accelerators.evaluate(facts, ctx({0: "a", 1: "a"}))
    assert [f.level for f in found] == ["warn"]
    assert "no accelerator" in found[0].message and found[0].ranks == [0, 1]
    strict = Context(2, {**T, "accelerators": {**T["accelerators"], "require": True}}, {0: "a", 1: "a"})
    assert accelerators.evaluate(facts, strict)[0].level == "fail"


def test_accelerator_count_and_model_mismatch_named():
    def gpu(name, count):
        return {"accelerators": {"available": True, "flavour": "cuda", "count": count, "local_device": 0,
                                 "devices": [{"name": name, "arch": "sm_90", "memory_total": 80 * 2**30}] * count,
                                 "memory_free": 79 * 2**30, "memory_total": 80 * 2**30, "driver": "550"}}
    facts = {0: gpu("H100", 8), 1: gpu("H100", 8), 2: gpu("A100", 4)}
    found = accelerators.evaluate(facts, ctx({0: "n0", 1: "n0", 2: "n1"}))
    fails = [f.message for f in found if f.level == "fail"]
    assert any("count differs" in m and "rank 2 (n1)" in m for m in fails)
    assert any("models differ" in m and "rank 2 (n1)" in m for m in fails)


def test_environment_consistency_and_interfaces(monkeypatch):
    base = environment.collect({})
    facts = {}
    for r in range(3):
        env = {**base["env"], "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "3", "RANK": str(r),
               "LOCAL_RANK": "0", "NCCL_SOCKET_IFNAME": "eth9" if r == 2 else None}
        facts[r] = {"environment": {**base, "env": env}}
    facts[1]["environment"]["env"]["MASTER_PORT"] = "29501"
    found = environment.evaluate(facts, ctx({0: "a", 1: "b", 2: "c"}))
    messages = [f.message for f in found if f.level == "fail"]
    assert any("MASTER_PORT differs" in m and "rank 1 (b)" in m for m in messages)
    assert any("NCCL_SOCKET_IFNAME=eth9 matches no interface" in m and "rank 2 (c)" in m for m in messages)


def test_socket_ifname_syntax():
    names = ["lo", "eth0", "eth1", "ib0", "docker0"]
    assert environment.match_socket_ifname("eth", names) == ["eth0", "eth1"]
    assert environment.match_socket_ifname("=eth0", names) == ["eth0"]
    assert environment.match_socket_ifname("^lo,docker", names) == ["eth0", "eth1", "ib0"]
    assert network.hca_names("=mlx5_0:1,mlx5_1") == ["mlx5_0", "mlx5_1"]


def test_host_and_network_collect_here():
    facts = {0: {"host": host.collect({}), "network": network.collect({})}}
    found = host.evaluate(facts, ctx({0: "a"})) + network.evaluate(facts, ctx({0: "a"}))
    assert any(f.check == "host" and "CPUs usable" in f.message for f in found)
    assert any("collective library: gloo" in f.message for f in found)


def test_experiment_check_uses_world_and_memory():
    exp = {"model": {"n_layers": 2, "dim": 64, "n_heads": 4, "vocab_size": 100}, "layout": {"tp": 2, "dp": 2}}
    found = experiment.evaluate({0: {}, 1: {}}, ctx({0: "a", 1: "a"}, experiment=exp))
    assert [f.message for f in found if f.level == "fail"] == [
        "tp x pp x dp x cp = 2 x 1 x 2 x 1 = 4 does not equal the world size 2"]
    exp["layout"] = {"dp": 2}
    small_gpu = {"accelerators": {"available": True, "memory_total": 1000}}
    found = experiment.evaluate({0: small_gpu, 1: small_gpu}, ctx({0: "a", 1: "a"}, experiment=exp))
    assert any(f.level == "fail" and "exceeds" in f.message for f in found)


def test_thresholds_override(tmp_path):
    user = tmp_path / "t.yaml"
    user.write_text("performance:\n  straggler_fail_fraction: 0\n")
    assert load_thresholds(user)["performance"]["straggler_fail_fraction"] == 0.0
    assert load_thresholds(user)["host"] == T["host"]
    user.write_text("performance:\n  straggler_warn: 0.5\n")
    with pytest.raises(ConfigError, match="did you mean 'performance.straggler_warn_fraction'|did you mean 'straggler_warn_fraction'"):
        load_thresholds(user)
    user.write_text("host:\n  min_nofile: lots\n")
    with pytest.raises(ConfigError, match="must be a number"):
        load_thresholds(user)


def test_options():
    opts = PreflightOptions.from_dict({"checks": "gpu,host", "tests": "allreduce", "sizes": "4K,1M"})
    assert opts.checks == ["accelerators", "host"] and opts.tests == ["allreduce"] and opts.sizes == [4096, 2**20]
    assert parse_size("1GiB") == 2**30
    with pytest.raises(ConfigError, match="did you mean 'allgather'"):
        PreflightOptions(tests="allgathr")
    with pytest.raises(ConfigError, match="unknown preflight option 'quik'"):
        PreflightOptions.from_dict({"quik": True})


def test_bus_bandwidth_formulas():
    assert bus_factor("allreduce", 8) == 2 * 7 / 8
    assert bus_factor("allgather", 4) == bus_factor("reducescatter", 4) == bus_factor("alltoall", 4) == 0.75
    assert bus_factor("sendrecv", 16) == 1
    assert bandwidths("allreduce", 10**9, 0.5, 2) == (2.0, 2.0)
    rows = combine("allgather", "intra:a", [0, 1], {0: [{"size": 1000, "seconds": 1e-6}], 1: [{"size": 1000, "seconds": 2e-6}]})
    assert rows[0]["seconds"] == 2e-6 and rows[0]["algbw_gbps"] == pytest.approx(0.5) and rows[0]["busbw_gbps"] == pytest.approx(0.25)


def test_stragglers_named_with_host():
    values = {0: 100.0, 1: 98.0, 2: 30.0, 3: 70.0, 4: 101.0}  # median 98
    found = find_stragglers("GEMM", values, {0: "a", 1: "a", 2: "b", 3: "b", 4: "c"}, T, "GFLOP/s")
    assert [(f.level, f.ranks) for f in found] == [("fail", [2]), ("warn", [3])]
    assert "rank 2 (b)" in found[0].message


def test_missing_ranks_named_by_node():
    where = name_missing([5, 9], {0: "n0", 4: "n1", 6: "n1"}, 4, None)
    assert where == {5: "n1, node 1", 9: "node 2, host unknown"}
    assert name_missing([9], {}, 4, ["n0", "n1", "n2"]) == {9: "n2, node 2"}
