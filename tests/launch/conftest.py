"""Real cluster parts for the launcher tests: network namespaces, Slurm, podman, docker.

Each fixture runs a script from tests/fixtures/cluster/ (which installs missing Debian
packages) under a hard timeout, and always runs the matching teardown script. Tests skip
only where the machine cannot provide the part (not root, no network namespaces).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

CLUSTER = Path(__file__).resolve().parents[1] / "fixtures" / "cluster"


def script(name: str, env: dict[str, str], *args: str, timeout: int = 300, check: bool = True):
    out = subprocess.run(["timeout", "-k", "10", str(timeout), str(CLUSTER / name), *args],
                         env={**os.environ, **env}, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"{name} failed ({out.returncode}): {out.stdout[-2000:]} {out.stderr[-2000:]}")
    return out


def require_root_netns() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, Slurm daemons, rootful containers)")
    if not shutil.which("ip") or not shutil.which("nsenter") or not shutil.which("unshare"):
        pytest.skip("needs iproute2 and util-linux (ip, nsenter, unshare)")
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create network namespaces here: {probe.stderr.decode().strip()}")


class Netns:
    def __init__(self, prefix: str, subnet: str, state: Path):
        self.env = {"NS": prefix, "SUBNET": subnet, "STATE": str(state)}
        self.prefix, self.subnet = prefix, subnet

    def addr(self, i: int) -> str:
        return f"{self.subnet}.{i}"

    def on(self, i: int, argv: list[str]) -> list[str]:
        return [str(CLUSTER / "node_exec.sh"), str(i), *argv]

    def set_link(self, i: int, up: bool) -> None:
        subprocess.run(["ip", "link", "set", f"{self.prefix}_v{i}", "up" if up else "down"], check=True, timeout=10)


def netns_hosts(tmp_path_factory, prefix: str, subnet: str, count: int = 2):
    """``count`` "hosts" n1..n<count> on one bridge (a generator: the fixture's setup and teardown)."""
    require_root_netns()
    ns = Netns(prefix, subnet, tmp_path_factory.mktemp(prefix))
    script("netns_down.sh", ns.env, check=False)  # leftovers of a crashed earlier run
    try:
        script("netns_up.sh", ns.env, str(count), timeout=120)
        yield ns
    finally:
        script("netns_down.sh", ns.env, check=False)


@pytest.fixture(scope="session")
def two_hosts(tmp_path_factory):
    """Two "hosts" n1/n2 (10.78.0.1/.2) on one bridge, for multi-node torchrun."""
    yield from netns_hosts(tmp_path_factory, "pnet", "10.78.0")


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A 2-node Slurm cluster: slurmctld on the host, slurmd n1/n2 each in its own namespace."""
    hosts_gen = netns_hosts(tmp_path_factory, "pslm", "10.79.0")
    hosts = next(hosts_gen)
    base = Path(f"/tmp/primus-slurm-{os.getpid()}")  # munged wants every parent of its socket world-executable
    base.mkdir(mode=0o755, exist_ok=True)
    env = {**hosts.env, "BASE": str(base), "CTLD_PORT": "16817"}
    try:
        script("slurm_down.sh", env, check=False)
        script("slurm_up.sh", env, "2", timeout=600)
        yield {"SLURM_CONF": str(base / "etc" / "slurm.conf"), "base": base}
    finally:
        script("slurm_down.sh", env, check=False)
        shutil.rmtree(base, ignore_errors=True)
        hosts_gen.close()


@pytest.fixture(scope="session")
def podman_env(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("rootful podman needs root")
    # a short path, as docker's: conmon's attach socket lives under the run root, and past a unix socket path's
    # 108 bytes (pytest's /tmp/pytest-of-root/pytest-N/popen-gwN/podman0/...) `podman run --rm` waited ~20 s
    # after the container had exited
    base = Path(tempfile.mkdtemp(prefix="primus-podman-"))
    try:
        script("podman_up.sh", {"BASE": str(base)}, timeout=600)
        yield {"CONTAINERS_CONF": str(base / "containers.conf"), "CONTAINERS_STORAGE_CONF": str(base / "storage.conf")}
    finally:
        script("podman_down.sh", {"BASE": str(base)}, check=False)


@pytest.fixture(scope="session")
def docker_env(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("a private dockerd needs root")
    base = Path(f"/tmp/primus-docker-{os.getpid()}")  # the socket path must stay short
    try:
        script("docker_up.sh", {"BASE": str(base)}, timeout=600)
        yield {"DOCKER_HOST": f"unix://{base}/docker.sock"}
    finally:
        script("docker_down.sh", {"BASE": str(base)}, check=False)
