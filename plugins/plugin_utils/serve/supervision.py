"""serve.yml: the ring as an OpenAI-compatible server, supervised from rank 0's node (pure functions).

The supervisor (roles/serve/files/serve_supervisor.py) runs on rank 0's node. It starts and watches every rank
through the rank's launcher script: rank 0's directly, each peer's over SSH with a key of its own that the
peer authorizes for one forced command (roles/serve/templates/peer.sh.j2) and nothing else. These functions write
its configuration, say what an exit status means, and turn its state file into what status prints.
"""

import ipaddress
import json
import shlex
import signal
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible_collections.prima.cluster.plugins.plugin_utils.launch.exit_status import status_words
from ansible_collections.prima.cluster.plugins.plugin_utils.transport.connections import known_hosts_name, ssh_endpoint

# prima.cpp's llama-server segfaults in its own cleanup on every shutdown at the pinned commit (SIGTERM: it
# stops the ring, then exits 139). A stop that ends so is clean; a 139 while serving is a crash.
PRIMA_SHUTDOWN_EXIT = 139
CLEAN_STOP_EXITS = (0, 128 + signal.SIGTERM)


# The key every request to a served ring carries (llama-server's --api-key-file): serve.yml, bench.yml -e
# mode=server and the serve role check it here, and only here.
API_KEY_MIN = 16
API_KEY_FIX = 'ansible-vault encrypt_string "$(openssl rand -hex 24)" --name vault_serve_api_key'


def api_key_problems(key: Any, variable: str = "vault_serve_api_key", purpose: str = "") -> List[str]:
    """Why `key` cannot be the server's API key: not text, shorter than API_KEY_MIN, or holding a blank (an empty
    line of the key file would be skipped by llama-server, leaving a server that takes any request)."""
    if isinstance(key, str) and len(key) >= API_KEY_MIN and not any(character.isspace() for character in key):
        return []
    return ["%s: %sset it in the vault, %d characters or more with no blank or newline in it: %s"
            % (variable, purpose + "; " if purpose else "", API_KEY_MIN, API_KEY_FIX)]


def settings_problems(settings: Mapping[str, Any], rank_ports: Sequence[int] = ()) -> List[str]:
    """The serve role's settings, checked before any node is touched; each problem names its variable and fix."""
    problems = []  # type: List[str]
    bind = str(settings.get("serve_bind", ""))
    try:
        ipaddress.ip_address(bind)
    except ValueError:
        problems.append("serve_bind %r is not an IP address; 127.0.0.1 (the default, reached through the SSH tunnel) "
                        "or this node's own address" % bind)
    for name, low, high in (("serve_port", 1, 65535), ("serve_local_port", 1, 65535), ("serve_parallel", 1, 256),
                            ("serve_ctx_size", 64, 1 << 22), ("serve_restarts", 0, 1000),
                            ("serve_listen_timeout_s", 1, 1 << 20), ("serve_load_timeout_s", 1, 1 << 20),
                            ("serve_control_timeout_s", 1, 3600), ("serve_stderr_tail_lines", 0, 200)):
        value = settings.get(name)
        if isinstance(value, bool) or not str(value).strip().isdigit() or not low <= int(value) <= high:
            problems.append("%s %r is not a whole number from %d to %d" % (name, value, low, high))
    for name in ("serve_backoff_s", "serve_backoff_max_s"):
        try:
            if not 0 <= float(settings.get(name)) <= 86400:
                raise ValueError
        except (TypeError, ValueError):
            problems.append("%s %r is not a number of seconds from 0 to 86400" % (name, settings.get(name)))
    if not problems and int(settings["serve_ctx_size"]) < 64 * int(settings["serve_parallel"]):
        problems.append("serve_ctx_size %s leaves fewer than 64 tokens to each of serve_parallel %s slots; raise it"
                        % (settings["serve_ctx_size"], settings["serve_parallel"]))
    if not problems and int(settings["serve_port"]) in set(int(port) for port in rank_ports):
        problems.append("serve_port %s is a port of the ring's ranks; pick another" % settings["serve_port"])
    return problems


def control_argv(endpoint: Mapping[str, Any], key: str, known_hosts: str, unit: str) -> List[str]:
    """How rank 0's node runs a verb of `unit` on a peer: SSH with the serve key, the peer's forced command
    takes `<unit> <verb> [number]` (the verb and number are appended by the supervisor)."""
    return ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "IdentitiesOnly=yes",
            "-o", "IdentityFile=%s" % key, "-o", "UserKnownHostsFile=%s" % known_hosts,
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes",
            "-o", "HostKeyAlgorithms=ssh-ed25519", "-o", "LogLevel=ERROR",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
            "-p", str(endpoint["port"]), "%s@%s" % (endpoint["user"], endpoint["host"]), unit]


def supervisor_config(plan: Mapping[str, Any], hostvars: Mapping[str, Any], settings: Mapping[str, Any]
                      ) -> Dict[str, Any]:
    """The supervisor's configuration for one server unit (a launch plan rendered with launch_server).

    settings: launch_dir, key, known_hosts, state_dir, restarts, backoff_s, backoff_max_s, listen_timeout_s,
    load_timeout_s, stderr_tail_lines, control_timeout_s."""
    if not plan.get("server"):
        raise ValueError("unit %s is not a server unit (rendered without launch_server)" % plan.get("name"))
    name = str(plan["name"])
    ranks = []
    for host in plan["hosts"]:
        unit = plan["units"][host]
        script = "%s/%s.sh" % (str(settings["launch_dir"]).rstrip("/"), name)
        if int(unit["rank"]) == 0:
            control = [script]
        else:
            control = control_argv(ssh_endpoint(hostvars, host), settings["key"], settings["known_hosts"], name)
        ranks.append({"rank": int(unit["rank"]), "host": host, "role": unit["role"], "control": control})
    state_dir = "%s/%s" % (str(settings["state_dir"]).rstrip("/"), name)
    clean = list(CLEAN_STOP_EXITS) + ([PRIMA_SHUTDOWN_EXIT] if plan["runtime"] == "prima" else [])
    port = int(plan["server"]["port"])
    return {"name": name, "runtime": plan["runtime"], "model": plan["model"],
            "state_file": state_dir + "/supervisor.json", "pid_file": state_dir + "/supervisor.pid",
            "ranks": sorted(ranks, key=lambda rank: rank["rank"]),
            "health_url": "http://%s:%d/health" % (health_host(plan["server"]["bind"]), port),
            "listen_timeout_s": int(settings["listen_timeout_s"]), "load_timeout_s": int(settings["load_timeout_s"]),
            "restarts": int(settings["restarts"]), "backoff_s": float(settings["backoff_s"]),
            "backoff_max_s": float(settings["backoff_max_s"]), "clean_stop_exits": clean,
            "stderr_tail_lines": int(settings["stderr_tail_lines"]),
            "control_timeout_s": int(settings["control_timeout_s"])}


def health_host(bind: str) -> str:
    """Where rank 0's node itself reaches a server bound to `bind` (any address: its loopback)."""
    if bind in ("", "0.0.0.0", "::", "[::]"):
        return "127.0.0.1"
    return "[%s]" % bind if ":" in bind and not bind.startswith("[") else bind


def peer_units(plans: Mapping[str, Any], host: str, launch_dir: str) -> List[Dict[str, str]]:
    """The server units a peer's forced command may drive: those where this host runs a worker."""
    return [{"name": name, "script": "%s/%s.sh" % (launch_dir.rstrip("/"), name)}
            for name, plan in sorted(plans.items())
            if plan.get("server") and host in plan["units"] and plan["units"][host]["rank"] != 0]


def known_hosts(hosts: Sequence[str], head: str, hostvars: Mapping[str, Any], key_var: str) -> List[str]:
    """known_hosts lines for rank 0's node: each peer's host key under the address rank 0 reaches it on."""
    return ["%s %s" % (known_hosts_name(ssh_endpoint(hostvars, peer)),
                       " ".join(str(hostvars[peer][key_var]).split()[:2]))
            for peer in hosts if peer != head]


def exit_meaning(code: Optional[int], runtime: str = "", role: str = "", stopping: bool = False,
                 stalled_s: Optional[int] = None) -> str:
    """What a rank's exit status says, in words (the ranks run under timeout(1), which passes a signal's 128+N);
    stalled_s: the seconds of the watchdog that stopped it, as the rank's status gives them."""
    if code is None:
        return "no exit status (still running, or never started)"
    code = int(code)
    if code == 0:
        return "exited 0"
    if stopping and runtime == "prima" and role == "head" and code == PRIMA_SHUTDOWN_EXIT:
        return ("exited 139 (SIGSEGV) on shutdown: prima.cpp's llama-server does so on every stop at the pinned "
                "commit, a clean stop")
    return "exited %d: %s" % (code, status_words(code, stalled_s, "launch_server_stall_s"))


def failure_text(failure: Optional[Mapping[str, Any]], runtime: str) -> str:
    """One line for a failure the supervisor recorded: rank, host, what happened (the exit status in words, or
    the supervisor's own words where there is no status: lost contact, not healthy in time), when."""
    if not failure:
        return "none"
    role = str(failure.get("role", ""))
    if failure.get("exit") is not None:
        what = exit_meaning(failure.get("exit"), runtime, role, stalled_s=failure.get("stalled_s"))
    else:
        # The supervisor's message starts by naming the rank, as this line does already.
        what = str(failure.get("message") or "failed").split(": ", 1)[-1]
    text = "rank %s on %s (%s): %s" % (failure.get("rank"), failure.get("host"), role or "rank", what)
    if failure.get("phase") == "starting":
        text += ", while the ring was starting"
    if failure.get("at"):
        text += ", at %s" % failure["at"]
    return text


def status_lines(state: Mapping[str, Any], health: Optional[Mapping[str, Any]] = None) -> List[str]:
    """What `serve.yml -e state=status` prints for one server: what runs, since when, restarts, last failure."""
    name = state.get("name", "serve")
    runtime = str(state.get("runtime", ""))
    what = str(state.get("state", "unknown"))
    if state.get("state") in ("running", "starting", "restarting", "stopping") and not state.get("alive", True):
        what = "%s, but its supervisor (pid %s) is gone: the state is stale" % (what, state.get("pid"))
    lines = ["%s: %s (runtime %s, model %s)" % (name, what, runtime, state.get("model", "?"))]
    if state.get("state") in ("running", "starting", "restarting"):
        lines.append("answers (model \"%s\"): %s" % (state.get("model", "?"), openai_endpoints(runtime)))
    if state.get("error"):
        lines.append("cannot tell more: %s" % state["error"])
    if state.get("since"):
        lines.append("serving since %s (supervisor up since %s, pid %s)"
                     % (state["since"], state.get("supervisor_started"), state.get("pid")))
    if state.get("state") == "restarting" and state.get("next_start"):
        lines.append("next start at %s" % state["next_start"])
    lines.append("restarts: %s of %s, failures: %d" % (state.get("restarts", 0), state.get("max_restarts", "?"),
                                                       len(state.get("failures") or [])))
    failure = state.get("last_failure")
    lines.append("last failure: %s" % failure_text(failure, runtime))
    if failure and failure.get("stderr_tail"):
        lines.append("its last stderr lines:")
        lines += ["  " + str(line) for line in failure["stderr_tail"]]
    if state.get("state") == "failed":
        lines.append("failed: restarts exhausted after rank %s on %s died; every rank is stopped. Start it again "
                     "with ansible-playbook serve.yml -e state=restarted"
                     % ((failure or {}).get("rank"), (failure or {}).get("host")))
    stop = state.get("stop")
    if stop:
        lines.append("last stop: %s" % ("clean" if stop.get("clean") else "NOT clean"))
        for rank in stop.get("ranks", []):
            # The supervisor judged the stop (clean_stop_exits, the head's 139 under prima.cpp); its note says why.
            role = "head" if rank.get("rank") == 0 else "worker"
            meaning = rank.get("note") or exit_meaning(rank.get("exit"), runtime, role, stopping=True)
            lines.append("  rank %s on %s: %s (%s)" % (rank.get("rank"), rank.get("host"), meaning,
                                                       "clean" if rank.get("clean") else "NOT clean"))
    if health is not None:
        lines.append("health: HTTP %s %s" % (health.get("status", "?"), health.get("json") or ""))
    return lines


# What each runtime's llama-server answers in OpenAI's shape. prima.cpp's server (at the pinned commit) answers
# /v1/completions in llama.cpp's native shape (content, no choices): OpenAI's clients cannot read it.
OPENAI_ENDPOINTS = {
    "prima": "OpenAI-style: /v1/models, /v1/chat/completions (streamed or not); /v1/completions answers in "
             "llama.cpp's native shape (content, no choices), which OpenAI's clients cannot read",
    "llama_rpc": "OpenAI-style: /v1/models, /v1/chat/completions and /v1/completions (streamed or not)",
    "single": "OpenAI-style: /v1/models, /v1/chat/completions and /v1/completions (streamed or not)",
}


def openai_endpoints(runtime: str) -> str:
    return OPENAI_ENDPOINTS.get(str(runtime), OPENAI_ENDPOINTS["single"])


def reach(hostvars: Mapping[str, Any], head: str, bind: str, port: int, local_port: int, header_file: str,
          model: str = "") -> Dict[str, str]:
    """How the controller reaches the server: an SSH tunnel to rank 0's node (its Ansible connection), and a
    curl that sends the key from a file (the key itself is never printed)."""
    values = hostvars[head]
    host = values.get("ansible_host") or head
    # ssh -L takes an IPv6 address in brackets (8080:[::1]:8080).
    argv = ["ssh", "-N", "-L", "%d:%s:%d" % (int(local_port), health_host(bind), int(port))]
    if values.get("ansible_port"):
        argv += ["-p", str(values["ansible_port"])]
    if values.get("ansible_ssh_private_key_file"):
        argv += ["-i", str(values["ansible_ssh_private_key_file"])]
    # As Ansible reaches the node: its host key handling included (the sandbox makes new host keys on each start).
    argv += shlex.split(str(values.get("ansible_ssh_common_args") or ""))
    argv.append("%s@%s" % (values.get("ansible_user") or "root", host))
    body = json.dumps(dict({"model": model} if model else {}, messages=[
        {"role": "user", "content": "Say hello in five words."}], max_tokens=32))
    curl = ["curl", "-sS", "-H", "@" + header_file, "-H", "Content-Type: application/json", "-d", body,
            "http://127.0.0.1:%d/v1/chat/completions" % int(local_port)]
    return {"ssh": " ".join(shlex.quote(str(arg)) for arg in argv),
            "curl": " ".join(shlex.quote(str(arg)) for arg in curl)}
