"""The cluster transport: which ports each node needs on each peer, the authorized_keys lines, the forwards,
the auto decision and the naming of a tunnel that dropped during a run."""

import os

import pytest

from ansible_collections.prima.cluster.plugins.plugin_utils.launch.plan import LaunchOptions, launch_plans
from ansible_collections.prima.cluster.plugins.plugin_utils.transport.connections import (
    PortBases, authorized_key_line, choose, drop_problems, forward_argv, forward_endpoint, forward_user_problems,
    known_hosts_name, needed_ports, network_problems, port_problems, probe_targets, rank_links, sshd_check_argv,
    sshd_match_block, sshd_problems, ssh_endpoint)

BASES = PortBases(data=9000, signal=10000, rpc=50052, fanout=18090)
RANKS = {"n0": 0, "n1": 1, "n2": 2}
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBVl4s0yJ7mS0Vq9z5l3k1Jt2H0w7a2p3o6bq3r5l9xY prima-cluster@n1"


def test_each_node_needs_its_next_rank_rank_0_and_from_the_head_each_worker():
    needs = needed_ports(RANKS, BASES)
    # Rank 1: rank 2's ring ports (world 3) and rank 0's (the master; and its next in world 2); the fan-out.
    assert needs["n1"] == {"n0": [9000, 10000, 18090], "n2": [9002, 10002, 18090]}
    # Rank 2, the last: rank 0 only, and nothing of rank 1 but the fan-out.
    assert needs["n2"] == {"n0": [9000, 10000, 18090], "n1": [18090]}
    # The head: the next rank's ring ports and every worker's RPC port (rank R on rpc + R - 1).
    assert needs["n0"] == {"n1": [9001, 10001, 18090, 50052], "n2": [18090, 50053]}


def test_prima_cpp_allocator_may_skip_ranks_so_every_peer_ring_port_is_forwarded():
    needs = needed_ports(RANKS, BASES, allocator=True)
    assert needs["n2"]["n1"] == [9001, 10001, 18090] and needs["n0"]["n2"] == [9002, 10002, 18090, 50053]


def test_the_ranks_links_leave_the_fanout_port_to_the_fanout():
    links = rank_links(needed_ports(RANKS, BASES), BASES)
    assert links["n2"]["n1"] == [] and links["n1"]["n0"] == [9000, 10000]


def test_ports_that_would_collide_are_named():
    assert port_problems(RANKS, BASES) == []
    clash = port_problems(RANKS, PortBases(data=9000, signal=9001, rpc=50052, fanout=18090))
    assert clash and "port 9001 is both the prima.cpp signal port of rank 0 on n0 and the prima.cpp data port of " \
                     "rank 1 on n1" in clash[0]
    fanout = port_problems(RANKS, PortBases(data=9000, signal=10000, rpc=50052, fanout=9002))
    assert fanout == ["port 9002 is both the weights fan-out server and the prima.cpp data port of rank 2: "
                      "change cluster_fanout_port"]
    assert "outside 1024-65535" in port_problems(RANKS, PortBases(data=65534, signal=10000, rpc=50052, fanout=18090))[0]


def test_authorized_key_line_restricts_the_key_to_forwards_to_those_ports():
    line = authorized_key_line(KEY, [10001, 9001, 9001], "prima-cluster@n1")
    assert line.startswith('restrict,pty,command="exec sleep infinity",port-forwarding,permitopen="127.0.0.1:9001",'
                           'permitopen="127.0.0.1:10001" ssh-ed25519 AAAA')
    assert line.endswith(" prima-cluster@n1")
    for bad_key in ("", "ssh-ed25519", 'ssh-ed25519 AAAA"x', "command=\"sh\" ssh-ed25519 AAAA\nssh-rsa B"):
        with pytest.raises(ValueError, match="not an OpenSSH public key"):
            authorized_key_line(bad_key, [9001], "c")
    with pytest.raises(ValueError, match="cannot carry"):
        authorized_key_line(KEY, [9001], "n1\nssh-rsa AAAA")


def test_ssh_endpoint_defaults_to_the_ansible_connection_and_refuses_injection():
    hostvars = {"n1": {"ansible_host": "access.example.com", "ansible_port": "15692"},
                "n2": {"ansible_host": "gw", "cluster_ssh_host": "10.0.0.2", "cluster_ssh_port": 22, "ansible_user": "u"},
                "n3": {"ansible_host": "gw; rm -rf /"}, "n4": {"ansible_host": "gw", "ansible_port": 70000},
                "n5": {}}
    assert ssh_endpoint(hostvars, "n1") == {"host": "access.example.com", "port": 15692, "user": "root"}
    assert ssh_endpoint(hostvars, "n2") == {"host": "10.0.0.2", "port": 22, "user": "u"}
    assert ssh_endpoint(hostvars, "n5") == {"host": "n5", "port": 22, "user": "root"}
    with pytest.raises(ValueError, match="host n3: cluster_ssh_host"):
        ssh_endpoint(hostvars, "n3")
    with pytest.raises(ValueError, match="host n4: cluster_ssh_port 70000"):
        ssh_endpoint(hostvars, "n4")
    assert known_hosts_name({"host": "gw", "port": 2210}) == "[gw]:2210"
    assert known_hosts_name({"host": "gw", "port": 22}) == "gw"


def test_forward_argv_keeps_alive_exits_on_forward_failure_and_checks_the_host_key():
    argv = forward_argv({"host": "gw", "port": 2210, "user": "prima-tunnel"}, [10001, 9001], "/k", "/kh", 5, 3)
    assert argv[:2] == ["ssh", "-tt"] and argv[-1] == "prima-tunnel@gw"
    for option in ("ExitOnForwardFailure=yes", "ServerAliveInterval=5", "ServerAliveCountMax=3",
                   "StrictHostKeyChecking=yes", "UserKnownHostsFile=/kh", "IdentityFile=/k", "BatchMode=yes",
                   "CheckHostIP=no", "UpdateHostKeys=no"):
        assert option in argv
    forwards = [argv[index + 1] for index, arg in enumerate(argv) if arg == "-L"]
    assert forwards == ["127.0.0.1:9001:127.0.0.1:9001", "127.0.0.1:10001:127.0.0.1:10001"]


def test_auto_picks_direct_only_when_every_port_was_reached():
    hostvars = {host: {"cluster_ip": "10.0.0.%d" % rank} for host, rank in RANKS.items()}
    reached = {host: {"unreached": {}, "rtt_ms": {}} for host in RANKS}
    assert choose("auto", list(RANKS), hostvars, reached)["mode"] == "direct"
    blocked = dict(reached, n1={"unreached": {"10.0.0.0:9000": "Connection refused"}})
    decision = choose("auto", list(RANKS), hostvars, blocked)
    assert decision["mode"] == "ssh" and "n1 cannot reach 10.0.0.0:9000 (Connection refused)" in decision["reason"]
    assert choose("auto", list(RANKS), hostvars, dict(reached, n2={"skipped": True}))["mode"] == "ssh"
    assert choose("ssh", list(RANKS), hostvars)["reason"] == "cluster_network=ssh"
    assert choose("direct", list(RANKS), hostvars, blocked)["mode"] == "direct"
    no_ip = dict(hostvars, n2={})
    assert "no cluster_ip for n2" in choose("auto", list(RANKS), no_ip)["reason"]
    with pytest.raises(ValueError, match="cluster_network 'vpn'"):
        choose("vpn", list(RANKS), hostvars)


def test_auto_probe_listens_until_every_peer_that_needs_a_port_came():
    hostvars = {host: {"cluster_ip": "10.0.0.%d" % rank} for host, rank in RANKS.items()}
    spec = probe_targets(needed_ports(RANKS, BASES), hostvars, "n0")
    # Rank 0's data port is reached by both other ranks (the master), its fan-out port too.
    assert spec["expect_per_port"] == {"9000": 2, "10000": 2, "18090": 2}
    assert "10.0.0.1:50052" in spec["targets"] and "10.0.0.2:50053" in spec["targets"]


def test_cluster_network_is_one_value():
    assert network_problems(["a", "b"], {"a": {}, "b": {"cluster_network": "auto"}}) == []
    problems = network_problems(["a", "b"], {"a": {"cluster_network": "ssh"}, "b": {"cluster_network": "direct"}})
    assert problems == ["cluster_network differs between hosts (direct: b; ssh: a): it is one value for the whole "
                        "cluster; set it in group_vars or with -e"]
    assert "is not one of auto, direct, ssh" in network_problems(["a"], {"a": {"cluster_network": "wan"}})[0]


def test_a_dropped_tunnel_is_named_with_the_ranks_it_carried():
    values = {"models_dir": "/m", "state_dir": "/s", "prima_cli": "cli", "llama_cpp_bin": "/b", "data_port_base": 9000,
              "signal_port_base": 10000, "rpc_port": 50052, "layer_window": "auto", "prefetch": False, "threads": 1,
              "prompt": "p", "n_predict": 1, "ctx_size": 64, "seed": 1, "transport": "ssh"}
    nodes = [{"host": host, "address": "10.0.0.%d" % rank, "cores": 1,
              "memory": {"ram": 2 ** 34, "vram": 0, "total": 2 ** 34}} for host, rank in RANKS.items()]
    plan = launch_plans(nodes, ["llama_rpc"], ["tiny"], {"tiny": {"n_layer": 8, "files": [{"name": "t", "size": 8}]}},
                        LaunchOptions.from_mapping(values))["llama_rpc-tiny"]
    drops = {"n0": [{"peer": "n2", "ports": [18090, 50053], "exit": 255, "after_s": 3.7},
                    {"peer": "n2", "ports": [18090, 50053], "exit": 137, "after_s": 2.5}],
             "n1": [{"peer": "n0", "ports": [9000, 10000], "exit": 255, "after_s": 1.0}]}
    # n1's link to n0 carries prima.cpp ports only: no rank of this llama.cpp plan used it.
    assert drop_problems(plan, drops) == ["the SSH tunnel n0 -> n2 (port 50053) dropped during the run (ssh exited "
                                          "137, 2.5 s in and 1 more time(s) as it was started again): it carried "
                                          "rank 0 (n0) -> rank 2 (n2)"]


def test_a_limited_play_probes_among_its_own_hosts():
    hostvars = {host: {"cluster_ip": "10.0.0.%d" % rank} for host, rank in RANKS.items()}
    spec = probe_targets(needed_ports(RANKS, BASES), hostvars, "n0", among=["n0", "n1"])
    assert spec["targets"] == ["10.0.0.1:9001", "10.0.0.1:10001", "10.0.0.1:18090", "10.0.0.1:50052"]
    assert spec["expect_per_port"] == {"9000": 1, "10000": 1, "18090": 1}
    assert choose("auto", ["n0"], hostvars, {})["mode"] == "direct"


def test_the_forwards_log_in_as_the_forward_user_whoever_ansible_logs_in_as():
    hostvars = {"n1": {"ansible_host": "gw", "ansible_port": 2211, "cluster_ssh_user": "admin"}}
    assert forward_endpoint(hostvars, "n1", "prima-tunnel") == {"host": "gw", "port": 2211, "user": "prima-tunnel"}
    for bad in ("root", "Prima", "a b", "x;id", "", "u" * 33):
        with pytest.raises(ValueError, match="transport_user"):
            forward_endpoint(hostvars, "n1", bad)


def test_the_forward_user_is_one_new_unprivileged_user():
    hostvars = {"n0": {}, "n1": {"ansible_user": "ubuntu"}}
    assert forward_user_problems("prima-tunnel", ["n0", "n1"], hostvars) == []
    assert "not root" in forward_user_problems("root", ["n0"], hostvars)[0]
    # Its Match block forces a command that only sleeps: Ansible's own login must not be it.
    assert forward_user_problems("ubuntu", ["n0", "n1"], hostvars) == [
        "host n1: transport_user 'ubuntu' is the user Ansible and the serve control log in as; the forwards' user may "
        "only sleep and forward, so give transport_user another name"]
    split = dict(hostvars, n1={"transport_user": "other"})
    assert forward_user_problems("prima-tunnel", ["n0", "n1"], split) == [
        "transport_user differs between hosts (n1): it is one user for the whole cluster; set it in group_vars or "
        "with -e"]


def test_the_match_block_allows_local_forwards_over_a_sleeping_pty_only():
    block = sshd_match_block("prima-tunnel")
    lines = block.splitlines()
    assert lines[0] == "Match User prima-tunnel" and block.endswith("\n")
    settings = dict(line.strip().split(" ", 1) for line in lines[1:])
    assert settings == {"AllowTcpForwarding": "local", "AllowStreamLocalForwarding": "no", "PermitListen": "none",
                        "PermitOpen": "127.0.0.1:*", "X11Forwarding": "no", "AllowAgentForwarding": "no",
                        "PermitTunnel": "no", "PermitTTY": "yes", "ForceCommand": "exec sleep infinity"}
    with pytest.raises(ValueError):
        sshd_match_block("root")
    with pytest.raises(ValueError):
        sshd_match_block("x\nMatch all")
    assert sshd_check_argv("prima-tunnel") == ["/usr/sbin/sshd", "-T", "-C",
                                               "user=prima-tunnel,host=prima-cluster-peer,addr=127.0.0.1"]


SSHD_T = """port 22
allowtcpforwarding local
allowstreamlocalforwarding no
permitlisten none
permitopen 127.0.0.1:*
x11forwarding no
allowagentforwarding no
permittunnel no
permittty yes
forcecommand exec sleep infinity
pidfile /run/sshd.pid
"""


def test_sshd_problems_name_what_sshd_would_let_the_forward_user_do_and_the_fix():
    assert sshd_problems(SSHD_T, "prima-tunnel", "/etc/ssh/sshd_config.d/00-prima-transport.conf") == []
    # sshd_config without the Include (or an earlier Match of the same user): the global values apply.
    unread = SSHD_T.replace("allowtcpforwarding local", "allowtcpforwarding yes").replace("forcecommand exec sleep "
                                                                                          "infinity\n", "")
    [problem] = sshd_problems(unread, "prima-tunnel", "/etc/ssh/sshd_config.d/00-prima-transport.conf")
    assert "AllowTcpForwarding yes (wanted local); ForceCommand unset (wanted exec sleep infinity)." in problem
    assert "add `Include /etc/ssh/sshd_config.d/*.conf` at the top of /etc/ssh/sshd_config" in problem
    assert sshd_problems(SSHD_T + "permitopen 127.0.0.1:9000\n", "u", "/c")


def _setup_state(user, paths):
    import subprocess

    from ansible_collections.prima.cluster.plugins.plugin_utils.transport.connections import setup_state_argv

    done = subprocess.run(setup_state_argv(user, [str(path) for path in paths]), capture_output=True, text=True,
                          check=True)
    assert done.stderr == ""
    return done.stdout


def test_the_setup_state_changes_with_a_files_bytes_mode_or_presence_and_only_then(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    script = tmp_path / "forwarders.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    paths = [home, script, tmp_path / "absent"]
    first = _setup_state("nobody", paths)
    assert first == _setup_state("nobody", paths)
    assert "nobody:" in first and "No such file or directory" in first
    script.write_text("#!/bin/sh\n# edited\n")
    edited = _setup_state("nobody", paths)
    assert edited != first
    script.chmod(0o777)
    assert _setup_state("nobody", paths) != edited
    script.chmod(0o755)
    assert _setup_state("nobody", paths) == edited
    script.unlink()
    assert _setup_state("nobody", paths) != edited
    assert "no user prima-no-such-user" in _setup_state("prima-no-such-user", paths)


@pytest.mark.parametrize("user", ["root", "a;b", "x\nrm -rf /", ""])
def test_the_setup_state_refuses_a_user_the_forwards_could_not_log_in_as(user):
    from ansible_collections.prima.cluster.plugins.plugin_utils.transport.connections import setup_state_argv

    with pytest.raises(ValueError, match="is not a user name the forwards may log in as"):
        setup_state_argv(user, ["/tmp"])


def test_a_path_with_a_semicolon_or_newline_is_an_argument_not_part_of_the_script(tmp_path):
    odd = tmp_path / "a;touch pwned\nb"
    odd.write_text("x")
    out = _setup_state("nobody", [odd])
    assert not (tmp_path / "pwned").exists() and not os.path.exists("pwned")
    assert "regular file" in out
