"""serve.yml's plans and words: the server units' argv, the supervisor's configuration, exit statuses, status."""

import json
import os
import shlex

import pytest
import yaml

from ansible_collections.prima.cluster.plugins.plugin_utils.launch.plan import (host_units, launch_plans, plan_name,
                                                                                plan_names)
from ansible_collections.prima.cluster.plugins.plugin_utils.serve import supervision
from test_launch import TINY, nodes, options

SERVER = {"server": True, "server_bind": "127.0.0.1", "server_port": "8080", "server_parallel": "4",
          "server_api_key_file": "/etc/prima-bench/serve/api-key", "ctx_size": 4096}
HOSTVARS = {"n%d" % rank: {"ansible_host": "10.77.0.3", "ansible_port": 2210 + rank, "ansible_user": "root",
                           "ansible_ssh_private_key_file": "/keys/id", "ansible_ssh_common_args": "-o LogLevel=ERROR"}
            for rank in range(3)}
SETTINGS = {"launch_dir": "/etc/prima-bench", "key": "/etc/prima-bench/serve/id_ed25519",
            "known_hosts": "/etc/prima-bench/serve/known_hosts", "state_dir": "/var/lib/prima-bench", "restarts": 3,
            "backoff_s": 5, "backoff_max_s": 120, "listen_timeout_s": 600, "load_timeout_s": 1800,
            "stderr_tail_lines": 20, "control_timeout_s": 60}


def server_plan(runtime, count=3, **overrides):
    plans = launch_plans(nodes(count), [runtime], ["tiny"], {"tiny": TINY}, options(**dict(SERVER, **overrides)))
    return plans["serve-%s-tiny" % runtime]


def test_llama_rpc_server_runs_llama_server_over_the_workers_with_the_key_from_a_file():
    plan = server_plan("llama_rpc")
    head = plan["units"]["n0"]["argv"]
    assert head[0] == "/opt/llama.cpp/current/bin/llama-server"
    assert head[head.index("--rpc") + 1] == "10.77.0.11:50052,10.77.0.12:50053"
    for flag, value in (("--host", "127.0.0.1"), ("--port", "8080"), ("-np", "4"), ("-c", "4096"),
                        ("--api-key-file", "/etc/prima-bench/serve/api-key")):
        assert head[head.index(flag) + 1] == value
    assert "--cont-batching" in head and "--metrics" in head
    assert "-p" not in head and "-n" not in head and "--api-key" not in head
    assert plan["units"]["n0"]["listen"] == [8080]
    assert plan["units"]["n1"]["argv"][0].endswith("/ggml-rpc-server")
    assert plan["server"] == {"bind": "127.0.0.1", "port": 8080, "parallel": 4}
    assert plan["state_dir"] == "/var/lib/prima-bench/serve-llama_rpc-tiny"


def test_prima_server_is_llama_server_beside_llama_cli_with_the_ring_arguments():
    plan = server_plan("prima")
    head = plan["units"]["n0"]["argv"]
    assert head[0] == "/opt/prima/current/bin/llama-server"
    for flag, value in (("--world", "3"), ("--rank", "0"), ("--master", "10.77.0.10"), ("--next", "10.77.0.11"),
                        ("--port", "8080"), ("-lw", "3,3,2")):
        assert head[head.index(flag) + 1] == value
    assert "-p" not in head and "--seed" not in head
    assert plan["units"]["n1"]["argv"][0] == "/opt/prima/current/bin/llama-cli"
    assert 8080 in plan["units"]["n0"]["listen"]


@pytest.mark.parametrize("runtime", ["llama_rpc", "prima", "single"])
def test_every_server_names_the_model_by_its_catalog_key(runtime):
    head = server_plan(runtime)["units"]["n0"]["argv"]
    assert head[head.index("--alias") + 1] == "tiny"


def test_the_printed_curl_asks_for_the_model_by_its_key_and_the_endpoints_are_said_per_runtime():
    reached = supervision.reach(HOSTVARS, "n0", "127.0.0.1", 8080, 18080, "/root/.config/h", "70b")
    body = shlex.split(reached["curl"])[shlex.split(reached["curl"]).index("-d") + 1]
    assert json.loads(body)["model"] == "70b"
    assert "native shape" in supervision.openai_endpoints("prima")
    assert "native" not in supervision.openai_endpoints("llama_rpc")
    lines = supervision.status_lines({"name": "serve-prima-70b", "state": "running", "runtime": "prima",
                                      "model": "70b"})
    assert lines[1].startswith('answers (model "70b"): OpenAI-style: /v1/models')


def test_single_server_and_bench_units_keep_their_names():
    assert server_plan("single")["units"]["n0"]["argv"][0].endswith("/llama-server")
    bench = launch_plans(nodes(2), ["single"], ["tiny"], {"tiny": TINY}, options())
    assert list(bench) == ["single-tiny"] and bench["single-tiny"]["server"] is None


def test_supervisor_config_reaches_peers_through_their_ssh_endpoint_with_the_serve_key():
    config = supervision.supervisor_config(server_plan("llama_rpc"), HOSTVARS, SETTINGS)
    ranks = config["ranks"]
    assert ranks[0] == {"rank": 0, "host": "n0", "role": "head",
                        "control": ["/etc/prima-bench/serve-llama_rpc-tiny.sh"]}
    ssh = ranks[2]["control"]
    assert ssh[0] == "ssh" and ssh[-2:] == ["root@10.77.0.3", "serve-llama_rpc-tiny"]
    assert ssh[ssh.index("-p") + 1] == "2212" and "IdentityFile=/etc/prima-bench/serve/id_ed25519" in ssh
    assert config["health_url"] == "http://127.0.0.1:8080/health"
    assert config["clean_stop_exits"] == [0, 143]
    assert supervision.supervisor_config(server_plan("prima"), HOSTVARS, SETTINGS)["clean_stop_exits"] == [0, 143, 139]
    assert config["state_file"] == "/var/lib/prima-bench/serve-llama_rpc-tiny/supervisor.json"


def test_supervisor_config_refuses_a_bench_unit_and_a_bad_endpoint():
    bench = launch_plans(nodes(2), ["llama_rpc"], ["tiny"], {"tiny": TINY}, options())["llama_rpc-tiny"]
    with pytest.raises(ValueError, match="not a server unit"):
        supervision.supervisor_config(bench, HOSTVARS, SETTINGS)
    bad = dict(HOSTVARS, n1=dict(HOSTVARS["n1"], ansible_host="10.0.0.1; rm -rf /"))
    with pytest.raises(ValueError, match="host n1"):
        supervision.supervisor_config(server_plan("llama_rpc"), bad, SETTINGS)


def test_peer_units_are_the_workers_only():
    plans = {"serve-llama_rpc-tiny": server_plan("llama_rpc")}
    assert supervision.peer_units(plans, "n1", "/etc/prima-bench") == [
        {"name": "serve-llama_rpc-tiny", "script": "/etc/prima-bench/serve-llama_rpc-tiny.sh"}]
    assert supervision.peer_units(plans, "n0", "/etc/prima-bench") == []
    assert host_units(plans, "n1")[0]["name"] == "serve-llama_rpc-tiny"


@pytest.mark.parametrize("code, stopping, runtime, words", [
    (None, False, "prima", "no exit status"),
    (0, False, "prima", "exited 0"),
    (137, False, "llama_rpc", "exited 137: killed (SIGKILL)"),
    (134, False, "llama_rpc", "exited 134: abort (SIGABRT)"),
    (139, True, "prima", "a clean stop"),
    (139, False, "prima", "exited 139: segfault (SIGSEGV)"),
    (139, True, "llama_rpc", "exited 139: segfault (SIGSEGV)"),
    (124, False, "prima", "exited 124: hang: killed by its timeout"),
    (1, False, "prima", "exited 1: error"),
    (130, False, "prima", "exited 130: killed by SIGINT"),
    (119, False, "prima", "exited 119: stalled: no output and no traffic for its launch_server_stall_s"),
])
def test_exit_meaning(code, stopping, runtime, words):
    assert words in supervision.exit_meaning(code, runtime, "head", stopping)


def test_status_lines_name_the_failed_rank_and_its_stderr():
    state = {"name": "serve-prima-tiny", "runtime": "prima", "model": "tiny", "state": "failed", "alive": False,
             "restarts": 1, "max_restarts": 1, "pid": 7, "failures": [{}, {}],
             "last_failure": {"rank": 1, "host": "n1", "role": "worker", "exit": 137, "at": "2026-12-03T10:00:00Z",
                              "stderr_tail": ["llama_model_load: ok", "killed"]}}
    lines = supervision.status_lines(state)
    assert lines[0] == "serve-prima-tiny: failed (runtime prima, model tiny)"
    assert "last failure: rank 1 on n1 (worker): exited 137: killed (SIGKILL), by kill -9 or the OOM killer, at " \
           "2026-12-03T10:00:00Z" in lines
    lost = dict(state["last_failure"], exit=None, phase="starting",
                message="rank 1 (worker on n1): lost contact: ssh exited 255")
    assert supervision.failure_text(lost, "prima") == (
        "rank 1 on n1 (worker): lost contact: ssh exited 255, while the ring was starting, at 2026-12-03T10:00:00Z")
    assert "  killed" in lines and "restarts: 1 of 1, failures: 2" in lines
    assert any(line.startswith("failed: restarts exhausted after rank 1 on n1") for line in lines)
    running = dict(state, state="running", alive=False, since="2026-12-03T10:00:00Z", last_failure=None)
    assert "its supervisor (pid 7) is gone" in supervision.status_lines(running)[0]
    stopped_head = {"rank": 0, "host": "n0", "exit": 139, "clean": True, "note": ""}
    stop = dict(state, state="stopped", stop={"clean": True, "ranks": [stopped_head]})
    assert any("a clean stop" in line for line in supervision.status_lines(stop))


def test_reach_prints_a_tunnel_as_ansible_connects_and_a_curl_without_the_key():
    reach = supervision.reach(HOSTVARS, "n0", "127.0.0.1", 8080, 18080, "/root/.config/prima-cluster/serve-n0.header")
    assert shlex.split(reach["ssh"]) == ["ssh", "-N", "-L", "18080:127.0.0.1:8080", "-p", "2210", "-i", "/keys/id",
                                         "-o", "LogLevel=ERROR", "root@10.77.0.3"]
    curl = shlex.split(reach["curl"])
    assert curl[curl.index("-H") + 1] == "@/root/.config/prima-cluster/serve-n0.header"
    assert curl[-1] == "http://127.0.0.1:18080/v1/chat/completions"
    assert supervision.reach(HOSTVARS, "n0", "0.0.0.0", 8080, 8080, "h")["ssh"].split()[3] == "8080:127.0.0.1:8080"


GOOD = {"serve_bind": "127.0.0.1", "serve_port": 8080, "serve_local_port": "18080", "serve_parallel": 4,
        "serve_ctx_size": 4096, "serve_restarts": 0, "serve_listen_timeout_s": 600, "serve_load_timeout_s": 1800,
        "serve_control_timeout_s": 60, "serve_stderr_tail_lines": 20, "serve_backoff_s": "2.5",
        "serve_backoff_max_s": 120}


@pytest.mark.parametrize("name, value, words", [
    ("serve_bind", "127.0.0.1\nx", "serve_bind '127.0.0.1\\nx' is not an IP address"),
    ("serve_bind", "localhost; rm -rf /", "is not an IP address"),
    ("serve_port", 0, "serve_port 0 is not a whole number from 1 to 65535"),
    ("serve_port", "80;", "serve_port '80;' is not a whole number"),
    ("serve_parallel", True, "serve_parallel True is not a whole number"),
    ("serve_backoff_s", "soon", "serve_backoff_s 'soon' is not a number of seconds"),
    ("serve_ctx_size", 128, "leaves fewer than 64 tokens to each of serve_parallel 4 slots"),
    ("serve_port", 9000, "serve_port 9000 is a port of the ring's ranks"),
])
def test_settings_problems_name_the_variable(name, value, words):
    assert supervision.settings_problems(GOOD, [9000, 10000]) == []
    problems = supervision.settings_problems(dict(GOOD, **{name: value}), [9000, 10000])
    assert len(problems) == 1 and words in problems[0], problems


def test_reach_keeps_an_ipv6_address_in_brackets_for_ssh():
    assert shlex.split(supervision.reach(HOSTVARS, "n0", "::1", 8080, 18080, "h")["ssh"])[3] == "18080:[::1]:8080"


def test_a_stalled_rank_reads_as_the_launchers_watchdog_said():
    failure = {"rank": 1, "host": "n1", "role": "worker", "exit": 119, "stalled_s": 300, "at": "2026-12-03T10:00:00Z",
               "message": "rank 1 (worker on n1): exited with status 119: stalled: no output and no traffic for 300 s"}
    assert supervision.failure_text(failure, "prima") == (
        "rank 1 on n1 (worker): exited 119: stalled: no output and no traffic for 300 s, at 2026-12-03T10:00:00Z")
    assert {unit["stall_s"] for unit in server_plan("prima")["units"].values()} == {0}  # idle is not a stall


@pytest.mark.parametrize("key", [None, 1234567890123456789, "", "short", "fifteen-chars-x", " " * 20,
                                 "sixteen-chars-ok\n", "with a blank in it here"])
def test_an_api_key_that_cannot_guard_the_server_is_refused_naming_the_variable_and_the_fix(key):
    [problem] = supervision.api_key_problems(key, "vault_serve_api_key", "every request must carry it")
    assert problem.startswith("vault_serve_api_key: every request must carry it; set it in the vault, 16 characters")
    assert problem.endswith('ansible-vault encrypt_string "$(openssl rand -hex 24)" --name vault_serve_api_key')


def test_a_good_api_key_passes_and_is_never_in_a_message():
    assert supervision.api_key_problems("sixteen-chars-ok") == [] and supervision.api_key_problems("x" * 40) == []
    assert "short-key" not in " ".join(supervision.api_key_problems("short-key"))


@pytest.mark.parametrize("port", [None, "0", "70000"])
def test_a_server_without_a_port_is_refused_naming_the_option(port):
    overrides = dict(SERVER, server_port=port) if port is not None else \
        {key: value for key, value in SERVER.items() if key != "server_port"}
    with pytest.raises(ValueError, match=r"launch option server_port: .* is not a port \(1-65535\)"):
        options(**overrides)


def test_the_server_port_has_one_definition_the_roles_take_by_default():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def defaults(role):
        with open(os.path.join(repo, "roles", role, "defaults", "main.yml")) as handle:
            return yaml.safe_load(handle)

    assert isinstance(defaults("cluster")["cluster_server_port"], int)
    for role, name in (("serve", "serve_port"), ("launch", "launch_server_port"), ("bench", "bench_server_port")):
        assert defaults(role)[name] == "{{ cluster_server_port }}", (role, name)


def test_plan_names_are_the_planner_s_own_in_bench_order():
    assert plan_names(["llama_rpc", "single"], ["tiny", "tiny-split"]) == [
        "llama_rpc-tiny", "llama_rpc-tiny-split", "single-tiny", "single-tiny-split"]
    assert plan_name("prima", "70b", True) == "serve-prima-70b"
    planned = launch_plans(nodes(2), ["llama_rpc", "single"], ["tiny"], {"tiny": TINY}, options())
    assert sorted(planned) == sorted(plan_names(["llama_rpc", "single"], ["tiny"]))
    served = launch_plans(nodes(2), ["llama_rpc"], ["tiny"], {"tiny": TINY}, options(**SERVER))
    assert list(served) == plan_names(["llama_rpc"], ["tiny"], server=True)
