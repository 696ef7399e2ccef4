"""The launcher: section: precedence, provenance, strict keys, Slurm step variables."""
import pytest

from primus.config.errors import ConfigError
from primus.launch.config import load_launcher_config, slurm_step_env
from primus.launch.executors import split_passthrough
from primus.launch.plan import plan_from_config
from tests.conftest import write


def _load(tmp_path, cli=None, env=None, project=None, user=None):
    env = {"PRIMUS_USER_CONFIG": str(tmp_path / "user.yaml"), **(env or {})}
    if user:
        write(tmp_path / "user.yaml", user)
    if project:
        write(tmp_path / "proj" / ".primus.yaml", project)
    return load_launcher_config(cli, env=env, cwd=tmp_path / "proj")


def test_user_then_project_then_env_then_command_line(tmp_path):
    config, prov = _load(tmp_path, user="launcher:\n  rdzv_timeout: 10\n  slurm: {partition: a, time: '1:00'}\n",
                         project="launcher:\n  slurm:\n    partition: b\n", env={"NNODES": "3"},
                         cli={"slurm.time": "2:00"})
    assert (config.rdzv_timeout, config.slurm.partition, config.slurm.time, config.nnodes) == (10, "b", "2:00", 3)
    assert prov.describe("launcher.slurm.partition").endswith(".primus.yaml:3")
    assert prov.describe("launcher.rdzv_timeout").endswith("user.yaml:2")
    assert prov.describe("launcher.nnodes") == "$NNODES"
    assert config.resolved_executor() == "multi-node"
    config, prov = _load(tmp_path, env={"NNODES": "3"}, cli={"nnodes": 2})
    assert config.nnodes == 2 and "--nnodes" in prov.describe("launcher.nnodes")


def test_unknown_key_is_one_line_with_file_line_and_did_you_mean(tmp_path):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, project="launcher:\n  slurm:\n    partiton: gpu\n")
    assert ".primus.yaml:3: unknown key 'launcher.slurm.partiton' (did you mean 'partition'?)" in str(err.value)
    with pytest.raises(ConfigError, match="unknown top-level key 'launch' \\(did you mean 'launcher'"):
        _load(tmp_path, project="launch: {}\n")
    (tmp_path / "proj" / ".primus.yaml").unlink()
    with pytest.raises(ConfigError, match=r"\$NNODES='two': expected a whole number"):
        _load(tmp_path, env={"NNODES": "two"})
    with pytest.raises(ConfigError, match="launcher.container.engine='rkt'"):
        _load(tmp_path, cli={"container.engine": "rkt"})


def test_explicit_project_file(tmp_path):
    path = write(tmp_path / "team.yaml", "launcher:\n  container: {image: rocm/primus:v1}\n")
    config, _ = load_launcher_config(None, project_file=str(path), env={"PRIMUS_USER_CONFIG": "/nonexistent"})
    assert config.resolved_executor() == "container" and config.wraps_container


def test_slurm_step_variables_fill_node_identity(tmp_path):
    env = {"SLURM_STEP_ID": "0", "SLURM_NODEID": "1", "SLURM_STEP_NUM_NODES": "2", "SLURM_JOB_ID": "42"}
    assert slurm_step_env(env) == {"nnodes": 2, "node_rank": 1, "rdzv_id": "slurm-42"}
    assert slurm_step_env({"SLURM_JOB_ID": "42"}) == {}  # a login shell inside salloc is not a node
    config, prov = _load(tmp_path, env={**env, "MASTER_ADDR": "n1", "PRIMUS_JOB_ID": "slurm-42"})
    plan = plan_from_config(config)
    assert (plan.nnodes, plan.node_rank, plan.master_addr, plan.rdzv_id) == (2, 1, "n1", "slurm-42")
    assert prov.describe("launcher.node_rank") == "Slurm (node_rank)"


def test_rendezvous_arguments_make_node_zero_the_store_host(tmp_path):
    config, _ = _load(tmp_path, cli={"nnodes": 2, "node_rank": 0, "master_addr": "10.0.0.1", "master_port": 29555,
                                     "rdzv_timeout": 30, "rdzv_id": "job7"})
    assert plan_from_config(config).rendezvous_args() == [
        "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29555", "--rdzv-id=job7",
        "--rdzv-conf=join_timeout=30,read_timeout=30,is_host=true"]
    with pytest.raises(ConfigError, match="needs the rendezvous host"):
        plan_from_config(_load(tmp_path, cli={"nnodes": 2})[0])
    with pytest.raises(ConfigError, match="node rank 2 is outside a 2-node job"):
        plan_from_config(_load(tmp_path, cli={"nnodes": 2, "node_rank": 2, "master_addr": "x"})[0])


def test_sbatch_flags_after_double_dash():
    assert split_passthrough(["a=1", "--", "--qos=x"], []) == (["a=1"], ["--qos=x"])
    # argparse swallows a "--" that directly follows the positional: recover it from argv
    assert split_passthrough(["--qos=x"], ["train", "E", "--", "--qos=x"]) == ([], ["--qos=x"])
    assert split_passthrough(["--training.steps", "3"], ["train", "E", "--training.steps", "3"]) == \
        (["--training.steps", "3"], [])


def test_elastic_nodes_min_max_reach_torchrun_and_need_restarts(tmp_path):
    import argparse

    from primus.launch.flags import node_count

    assert node_count("4") == 4 and node_count("2:4") == (2, 4)
    for bad in ("3:2", "0:2", "a:2", "2:"):
        with pytest.raises(argparse.ArgumentTypeError):
            node_count(bad)
    cli = {"nnodes": 2, "min_nodes": 1, "master_addr": "10.0.0.1", "max_restarts": 2}
    plan = plan_from_config(_load(tmp_path, cli=cli)[0])
    assert plan.elastic and plan.torchrun_args("t", tmp_path / "p.json")[0] == "--nnodes=1:2"
    # how long a restart waits for nodes beyond the minimum: torchrun's default 30 s, or --rdzv-last-call
    assert plan.rendezvous_args()[-1].endswith(",last_call_timeout=30")
    quick = plan_from_config(_load(tmp_path, cli={**cli, "rdzv_last_call": 2})[0])
    assert quick.rendezvous_args()[-1] == \
        "--rdzv-conf=join_timeout=300,read_timeout=300,is_host=true,last_call_timeout=2"
    with pytest.raises(ConfigError, match=r"-N 1:2 continues on fewer nodes through a restart: give --max-restarts"):
        plan_from_config(_load(tmp_path, cli={**cli, "max_restarts": 0})[0])
    with pytest.raises(ConfigError, match=r"-N 3:2: the minimum is above the number of nodes"):
        plan_from_config(_load(tmp_path, cli={**cli, "min_nodes": 3})[0])
    rigid = plan_from_config(_load(tmp_path, cli={**cli, "min_nodes": 2})[0])  # MIN == MAX: not elastic
    assert not rigid.elastic and rigid.torchrun_args("t", tmp_path / "p.json")[0] == "--nnodes=2"


def test_each_node_of_an_elastic_job_gets_the_last_call_wait(tmp_path):
    from primus.launch.executors import NodeRequest, node_command

    config, _ = _load(tmp_path, cli={"nnodes": 2, "min_nodes": 1, "master_addr": "n1", "max_restarts": 1,
                                     "rdzv_last_call": 5})
    argv = node_command(NodeRequest("train", ["/e.yaml"], []), config, "multi-node", with_node_identity=True)
    assert argv[argv.index("--rdzv-last-call") + 1] == "5" and argv[argv.index("--nnodes") + 1] == "1:2"
    rigid, _ = _load(tmp_path, cli={"nnodes": 2, "master_addr": "n1"})
    assert "--rdzv-last-call" not in node_command(NodeRequest("train", ["/e.yaml"], []), rigid, "multi-node",
                                                  with_node_identity=True)
