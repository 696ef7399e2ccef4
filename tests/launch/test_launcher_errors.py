"""Launcher failures are one line: what goes wrong in the launcher itself (here a rendezvous that
cannot start because its port is taken) ends in one ``[primus] FAILED`` line and exit 1, never a
Python traceback, and the attempt is recorded as failed."""
import json
import socket

import pytest

from tests.conftest import TINY_EXAMPLE

pytest.importorskip("torchtitan")


@pytest.mark.e2e
def test_a_port_in_use_on_one_node_is_one_failed_line(run_primus, workspace):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = run_primus("train", TINY_EXAMPLE, "--nproc-per-node", "2", "--master-port", str(port),
                            "exp_name=busyport", "training.steps=1", timeout=240)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    failed = [line for line in result.stderr.splitlines() if line.startswith("[primus] FAILED")]
    assert len(failed) == 1 and f"port {port} is already in use on 127.0.0.1: choose another MASTER_PORT" in failed[0]
    manifest = json.loads((workspace / "amd" / "root" / "busyport" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["exit_code"] == 1
