"""The cluster transport on the sandbox shaped like Glows: nodes reach each other only through SSH.

The suite's sandbox is the mapped topology (inventory/sandbox-mapped.yml): Ansible reaches each node through
the access gateway's mapped port, and a node cannot open a connection to another node's address. site.yml
(the session's provisioning) and bench.yml pick `ssh` on their own; flat_topology() shows `direct` on the
same nodes.
"""

import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from conftest import (ACCESS_ADDRESS, FLAT_INVENTORY, NODE_ROOT, SSH_PORTS, abandoned_on_failure, bench,
                      flat_topology, head_generating, rank_processes, run_playbook, wait_for)

TRANSPORT = NODE_ROOT + "/var/lib/prima-bench/transport"
# The peers' cluster keys log in as the unprivileged forwarding user (roles/transport, transport_user), never root.
AUTHORIZED = NODE_ROOT + "/var/lib/prima-tunnel/.ssh/authorized_keys"
ROOT_AUTHORIZED = NODE_ROOT + "/root/.ssh/authorized_keys"


def connects(namespace, address, port):
    """Whether a TCP connection from inside `namespace` (or from the host) to address:port succeeds."""
    if namespace is None:
        try:
            with socket.create_connection((address, port), timeout=3):
                return True
        except OSError:
            return False
    code = "import socket; socket.create_connection((%r, %d), timeout=3)" % (address, port)
    return subprocess.run(["ip", "netns", "exec", "psb-" + namespace, "python3", "-c", code],
                          capture_output=True, check=False).returncode == 0


def test_nodes_reach_each_other_only_through_the_gateway(sandbox):
    assert not connects("n1", "10.77.0.10", 22), "n1 opened a connection to n0's address"
    assert not connects("n0", "10.77.0.12", 22)
    assert not connects(None, "10.77.0.11", 22), "the controller reached n1's sshd around the gateway"
    # What a Glows instance reaches: the access host, and the internet (here the hub and the apt proxy).
    assert connects("n1", ACCESS_ADDRESS, SSH_PORTS["n0"])
    assert connects("n1", "10.77.0.2", 8088) and connects("n1", "10.77.0.1", 13142)
    assert connects(None, ACCESS_ADDRESS, SSH_PORTS["n2"])


def test_site_picked_ssh_and_authorized_each_key_for_its_ports_only(site_runs):
    cold, second = site_runs
    assert re.search(r"Cluster transport: ssh \(auto: n0 cannot reach 10\.77\.0\.11:\d+ \(Connection refused\)",
                     " ".join(cold.stdout.split())), cold.stdout[-3000:]
    keys = {}
    for host in ("n0", "n1", "n2"):
        with open(os.path.join(NODE_ROOT % host, "etc/prima-bench/transport/id_ed25519.pub")) as handle:
            keys[host] = handle.read().split()[1]
    assert len(set(keys.values())) == 3, "nodes share a cluster key"
    with open(AUTHORIZED % "n0") as handle:
        authorized = handle.read()
    # n1 and n2 may open forwards to rank 0's ring ports and to the fan-out server on n0, nothing else.
    for peer in ("n1", "n2"):
        [line] = [line for line in authorized.splitlines() if keys[peer] in line]
        assert line.startswith('restrict,pty,command="exec sleep infinity",port-forwarding,permitopen="127.0.0.1:9000",'
                               'permitopen="127.0.0.1:10000",permitopen="127.0.0.1:18090" ssh-ed25519 '), line
    with open(AUTHORIZED % "n1") as handle:
        [line] = [line for line in handle.read().splitlines() if keys["n0"] in line]
    assert 'permitopen="127.0.0.1:50052"' in line and "50053" not in line
    # The fan-out ran through the tunnels, and nothing of them is left running.
    assert "Forward the fan-out port to the source node" in cold.stdout
    assert rank_processes() == []


def listening(namespace, port):
    out = subprocess.run(["ip", "netns", "exec", "psb-" + namespace, "ss", "-Hltnx"], capture_output=True, text=True,
                         check=False).stdout
    return [line for line in out.splitlines() if re.search(r"[:\s]%d\s" % port, line + " ") or "/rogue" in line]


def from_n0_with_its_cluster_key(user, *forward):
    """ssh from n0's namespace to n1's mapped sshd with n0's cluster key, as a rogue n0 could."""
    key = os.path.join(NODE_ROOT % "n0", "etc/prima-bench/transport/id_ed25519")
    argv = ["ip", "netns", "exec", "psb-n0", "ssh", "-i", key, "-p", str(SSH_PORTS["n1"]), "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes",
            "-o", "ExitOnForwardFailure=yes", "-o", "ConnectTimeout=10", "-N"] + list(forward) \
        + ["%s@%s" % (user, ACCESS_ADDRESS)]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        out, dummy = process.communicate(timeout=8)
    except subprocess.TimeoutExpired:
        out = "still running after 8 s (the forward was taken)"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, out


def test_a_peers_cluster_key_cannot_listen_on_the_node_nor_log_in_as_root(site_runs):
    """The hostile review's reproduction: n0's cluster key made n1's sshd listen on 127.0.0.1:81 with -R."""
    for forward in (["-R", "127.0.0.1:81:127.0.0.1:22"], ["-R", "127.0.0.1:41003:127.0.0.1:22"],
                    ["-R", "/tmp/rogue.sock:127.0.0.1:22"]):
        code, out = from_n0_with_its_cluster_key("prima-tunnel", *forward)
        assert code == 255 and "forwarding failed" in out, (forward, code, out)
        assert listening("n1", 81) == [] and listening("n1", 41003) == [], forward
        assert not os.path.exists(os.path.join(NODE_ROOT % "n1", "tmp/rogue.sock"))
    code, out = from_n0_with_its_cluster_key("root", "-R", "127.0.0.1:81:127.0.0.1:22")
    assert code not in (None, 0) and "Permission denied" in out, out
    with open(os.path.join(NODE_ROOT % "n0", "etc/prima-bench/transport/id_ed25519.pub")) as handle:
        n0_key = handle.read().split()[1]
    with open(ROOT_AUTHORIZED % "n1") as handle:
        assert n0_key not in handle.read(), "n0's cluster key is still authorized for root on n1"


def test_a_tunnel_killed_mid_run_is_named_with_the_ranks_it_broke(site_runs, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "results.jsonl").write_text("untouched\n")
    started = time.time()
    run = bench(reports, "tunnel-kill", "bench-tunnel-kill", background=True, runtime="llama_rpc", runs=1,
                launch_n_predict=100000, launch_ctx_size=2048, launch_timeout_s=60)
    with abandoned_on_failure(run, "tunnel-kill"):
        wait_for(lambda: head_generating("llama_rpc-tiny", started, node="n0"), 120, "the head to generate")
        with open(os.path.join(TRANSPORT % "n0", "rank-n1.ssh.pid")) as handle:
            os.kill(int(handle.read()), signal.SIGKILL)
    result = run.finish()
    assert result.status == "failed", result.describe()
    assert re.search(r"the SSH tunnel n0 -> n1 \(port 50052\) dropped during the run \(ssh exited 137, [0-9.]+ s in[^)]*\): "
                     r"it carried rank 0 \(n0\) -> rank 1 \(n1\)", result.stdout), result.stdout[-4000:]
    assert (reports / "results.jsonl").read_text() == "untouched\n"
    assert rank_processes() == [], "left running: %s" % rank_processes()


def test_a_peer_whose_sshd_refuses_the_cluster_key_stops_bench_before_any_rank(site_runs, tmp_path):
    # n1's sshd reads keys from one central file that holds Ansible's key only (a hardened image):
    # Ansible still logs in, the cluster keys in ~/.ssh/authorized_keys are not read.
    root = NODE_ROOT % "n1"
    dropin = os.path.join(root, "etc/ssh/sshd_config.d/00-central-keys.conf")
    with open(os.path.join("/var/lib/prima-sandbox/ssh/id_ed25519.pub")) as handle:
        ansible_key = handle.read()
    with open(os.path.join(root, "etc/ssh/ansible_keys"), "w") as handle:
        handle.write(ansible_key)
    with open(dropin, "w") as handle:
        handle.write("AuthorizedKeysFile /etc/ssh/ansible_keys\n")
    reload_sshd(root)
    try:
        reports = tmp_path / "reports"
        reports.mkdir()
        # The probe of the peers still waits for n0's forwards, which never come: 5 s of it says as much as 15.
        result = bench(reports, "refused", "bench-refused-key", runtime="llama_rpc", runs=1, bench_probe_timeout_s=5)
    finally:
        os.remove(dropin)
        reload_sshd(root)
    assert result.status == "failed", result.describe()
    output = " ".join(result.stdout.split())  # the message as one line, however the callback wrapped it
    assert "link n0 -> n1 (ports 9001 10001 50052): the sshd of n1 (10.77.0.3:2211) refused the cluster key of n0" \
        in output, result.stdout[-4000:]
    assert "Run site.yml again so that n1 authorizes it" in output
    assert not (reports / "refused" / "raw" / "n0" / "llama_rpc-tiny").exists(), "a rank ran"
    assert rank_processes() == []


def reload_sshd(root):
    with open(os.path.join(root, "run/sshd.pid")) as handle:
        os.kill(int(handle.read()), signal.SIGHUP)


def test_the_same_nodes_on_a_flat_network_go_direct(site_runs, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    with flat_topology():
        result = run_playbook("bench.yml", inventory=FLAT_INVENTORY, label="bench-flat-direct",
                              extravars={"model": "tiny", "runtime": "llama_rpc", "runs": 1},
                              envvars={"PRIMA_BENCH_REPORTS_DIR": str(reports), "PRIMA_BENCH_RUN_ID": "flat"})
    assert result.status == "successful", result.describe()
    assert "Cluster transport: direct (auto: every node reached every port" in " ".join(result.stdout.split())
    # Other addresses, other known_hosts: the record of site.yml's setup does not match, so bench sets it up again.
    # Ansible lists an include's hosts in the order their results came in.
    included = re.search(r"transport/tasks/write\.yml for ([\w, ]+)", result.stdout)
    assert included and sorted(included.group(1).split(", ")) == ["n0", "n1", "n2"], result.stdout[-4000:]
    [line] = (reports / "results.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["transport"] == {"mode": "direct", "setting": "auto", "script": "/etc/prima-bench/transport/forwarders.sh",
                                   "reason": "auto: every node reached every port it needs on its peers' cluster_ip"}
    assert "| llama.cpp RPC | tiny | unshaped | direct | 3 |" in (reports / "flat" / "report.md").read_text()
    assert rank_processes() == []


@pytest.fixture(autouse=True)
def nothing_left_running():
    yield
    assert rank_processes() == [], "left running: %s" % rank_processes()
