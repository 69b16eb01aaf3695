"""The launch plan (who runs what, with which arguments) and the rendered units."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import jinja2
import pytest

from ansible_collections.prima.cluster.plugins.plugin_utils.launch.escaping import (
    c_escaped, systemd_executable, systemd_text)
from ansible_collections.prima.cluster.plugins.plugin_utils.launch.plan import (GIB, MIB, LaunchOptions, UnitContext,
                                                                                host_units, launch_plan, launch_plans,
                                                                                listen_ports, rank_hosts, usable_bytes,
                                                                                weights_path)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WATCHDOG = os.path.join(ROOT, "roles", "launch", "files", "rank_watchdog.py")
TINY = {"n_layer": 8, "files": [{"name": "tiny.gguf", "size": 8 * 1000}]}
SPLIT = {"n_layer": 80, "files": [{"name": "m-00002-of-00002.gguf", "size": 1},
                                  {"name": "m-00001-of-00002.gguf", "size": 1}]}
# As the launch role passes them: every value may come as a string from Jinja.
VALUES = {"models_dir": "/opt/models", "state_dir": "/var/lib/prima-bench", "prima_cli": "/opt/prima/current/bin/llama-cli",
          "llama_cpp_bin": "/opt/llama.cpp/current/bin", "rpc_port": "50052", "rpc_server_extra_args": [],
          "tensor_split": "", "layer_window": "auto", "prefetch": "False", "data_port_base": 9000,
          "signal_port_base": "10000", "threads": "0", "prompt": "Once upon a time", "n_predict": 32, "ctx_size": 512,
          "seed": 42, "head_extra_args": [], "rank_env": {}}


def options(**overrides):
    return LaunchOptions.from_mapping(dict(VALUES, **overrides))


OPTIONS = options()


def nodes(count, ram_gib=24, vram_gib=0):
    return [{"host": "n%d" % rank, "address": "10.77.0.%d" % (10 + rank), "cores": 2,
             "memory": {"ram": ram_gib * GIB, "vram": vram_gib * GIB, "total": (ram_gib + vram_gib) * GIB}}
            for rank in range(count)]


def plan_for(runtime, count, **overrides):
    plans = launch_plans(nodes(count), [runtime], ["tiny"], {"tiny": TINY}, options(**overrides))
    return plans["%s-tiny" % runtime]


def test_rank_hosts_in_rank_order_and_cut_to_world():
    assert rank_hosts({"b": 1, "a": 2, "c": 0}) == ["c", "b", "a"]
    assert rank_hosts({"b": 1, "a": 2, "c": 0}, 2) == ["c", "b"]
    assert rank_hosts({"b": 1, "a": 0}, "") == ["a", "b"]


def test_usable_memory_prefers_the_inventory_gpu_mem():
    assert usable_bytes({"memtotal_mb": 4096}, None, 2048) == {"ram": 2048 * MIB, "vram": 0, "total": 2048 * MIB}
    facts = {"memtotal_mb": 43008, "cuda_gpus": [{"memory_mib": 24564}]}
    assert usable_bytes(facts, None, 2048)["vram"] == 24564 * MIB
    assert usable_bytes(facts, "20", 2048)["vram"] == 20 * GIB


def test_weights_path_is_the_first_part_of_a_split_model():
    assert weights_path(SPLIT, "/opt/models/") == "/opt/models/m-00001-of-00002.gguf"


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_prima_ring(world):
    plan = plan_for("prima", world)
    units = [plan["units"]["n%d" % rank] for rank in range(world)]
    for rank, unit in enumerate(units):
        argv = unit["argv"]
        assert argv[argv.index("--rank") + 1] == str(rank)
        assert argv[argv.index("--world") + 1] == str(world)
        assert argv[argv.index("--master") + 1] == "10.77.0.10"
        assert argv[argv.index("--next") + 1] == "10.77.0.%d" % (10 + (rank + 1) % world)
        assert argv[argv.index("-t") + 1] == "2"
        assert unit["listen"] == [9000 + rank, 10000 + rank]
        assert ("-p" in argv) == (rank == 0) and ("-lw" in argv) == (rank == 0)
    assert sum(plan["window"]) == 8 and len(plan["window"]) == world
    assert units[0]["argv"][units[0]["argv"].index("-lw") + 1] == ",".join(map(str, plan["window"]))
    assert plan["fit_problems"] == []


def test_prima_gpu_layers_and_allocator_mode():
    plans = launch_plans(nodes(2, ram_gib=4, vram_gib=24), ["prima"], ["m"],
                         {"m": {"n_layer": 80, "files": [{"name": "m.gguf", "size": 80 * GIB // 2}]}}, OPTIONS)
    plan = plans["prima-m"]
    assert plan["window"] == [40, 40] and plan["gpu_layers"] == [40, 40]
    assert "-ngl" in plan["units"]["n1"]["argv"]
    prima_mode = launch_plans(nodes(2, vram_gib=8), ["prima"], ["tiny"], {"tiny": TINY},
                              options(layer_window="prima"))["prima-tiny"]
    assert prima_mode["window"] is None and "-lw" not in prima_mode["units"]["n0"]["argv"]
    assert prima_mode["units"]["n1"]["argv"][-2:] == ["--gpu-mem", "8"]


def test_prima_explicit_window_is_checked():
    assert plan_for("prima", 3, layer_window=[4, 2, 2])["window"] == [4, 2, 2]
    assert plan_for("prima", 3, layer_window="2,3,3")["window"] == [2, 3, 3]
    with pytest.raises(ValueError, match="sum to n_layer 8"):
        plan_for("prima", 3, layer_window=[4, 4, 4])


def test_prima_fit_problem_names_rank_and_sizes():
    plans = launch_plans(nodes(2, ram_gib=4), ["prima"], ["m"],
                         {"m": {"n_layer": 80, "files": [{"name": "m.gguf", "size": 40 * GIB}]}},
                         options(layer_window=[70, 10]))  # 0.5 GiB a layer, 4 GiB each
    problems = plans["prima-m"]["fit_problems"]
    assert problems[0].startswith("rank 0 (n0): 70 layers need 35.00 GiB, 4.00 GiB usable")
    assert problems[1].startswith("rank 1 (n1): 10 layers need 5.00 GiB, 4.00 GiB usable")
    fits = launch_plans(nodes(2, ram_gib=40), ["prima"], ["m"],
                        {"m": {"n_layer": 80, "files": [{"name": "m.gguf", "size": 40 * GIB}]}}, OPTIONS)
    assert fits["prima-m"]["fit_problems"] == []


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_llama_rpc(world):
    plan = plan_for("llama_rpc", world)
    head = plan["units"]["n0"]["argv"]
    assert head[0].endswith("llama-completion") and "-no-cnv" in head
    if world == 1:
        assert "--rpc" not in head
    else:
        assert head[head.index("--rpc") + 1] == ",".join("10.77.0.%d:%d" % (10 + rank, 50051 + rank) for rank in range(1, world))
    for rank in range(1, world):
        unit = plan["units"]["n%d" % rank]
        # Never 0.0.0.0; worker rank R on rpc_port + R - 1, so ports are unique across the cluster.
        assert unit["argv"][1:5] == ["-H", "10.77.0.%d" % (10 + rank), "-p", str(50051 + rank)]
        assert unit["env"] == {"LLAMA_CACHE": "/var/lib/prima-bench/llama_rpc-tiny/cache"}
        assert unit["role"] == "worker" and unit["listen"] == [50051 + rank]


def test_single_uses_rank_0_only():
    plan = plan_for("single", 3)
    assert list(plan["units"]) == ["n0"] and plan["world"] == 1 and "--rpc" not in plan["units"]["n0"]["argv"]


def test_head_extra_args_go_to_rank_0_only():
    for runtime in ("prima", "llama_rpc", "single"):
        plan = plan_for(runtime, 3, head_extra_args=["--log-disable"])
        heads = [host for host, unit in plan["units"].items() if unit["argv"][-1] == "--log-disable"]
        assert heads == ["n0"], runtime


def test_rank_env_reaches_every_rank_under_the_units_own():
    for runtime in ("prima", "llama_rpc", "single"):
        plan = plan_for(runtime, 3, rank_env={"OMP_WAIT_POLICY": "passive", "LLAMA_CACHE": "/elsewhere"})
        for unit in plan["units"].values():
            assert unit["env"]["OMP_WAIT_POLICY"] == "passive"
            if runtime == "llama_rpc" and unit["role"] == "worker":
                assert unit["env"]["LLAMA_CACHE"] == "/var/lib/prima-bench/llama_rpc-tiny/cache"


def test_unknown_runtime_and_model():
    with pytest.raises(ValueError, match="runtime 'mpi'"):
        launch_plan("mpi", ["n0"], ["10.0.0.1"], [{"total": 1, "vram": 0}], TINY,
                    UnitContext(OPTIONS, "/opt/models/tiny.gguf", "/var/lib/prima-bench/mpi-tiny", {"n0": 1}))
    with pytest.raises(ValueError, match="model 'huge' is not in the catalog"):
        launch_plans(nodes(1), ["single"], ["huge"], {"tiny": TINY}, OPTIONS)


def test_options_are_typed_once_and_bad_ones_named():
    assert OPTIONS.rpc_port == 50052 and OPTIONS.prefetch is False and OPTIONS.threads == 0
    assert options(rank_env={"B": 2, "A": "x"}).rank_env == (("A", "x"), ("B", "2"))
    with pytest.raises(ValueError, match="'A;rm -rf /': not an environment variable name"):
        options(rank_env={"A;rm -rf /": "1", "OK": "x;y"})
    assert options(rank_env={"OK": "x;y\nz"}).rank_env == (("OK", "x;y\nz"),)  # values are quoted in the script
    bad = dict(VALUES, rpc_port="fifty", prefetch="maybe", head_extra_args="--x", colour=1)
    del bad["seed"]
    with pytest.raises(ValueError) as error:
        LaunchOptions.from_mapping(bad)
    message = str(error.value)
    for fragment in ("unknown launch option colour", "launch option seed is missing", "launch option rpc_port:",
                     "launch option prefetch: 'maybe' is not true or false",
                     "launch option head_extra_args: '--x' is not a list of arguments"):
        assert fragment in message, message


def test_listen_ports_over_every_plan():
    plans = launch_plans(nodes(3), ["prima", "llama_rpc", "single"], ["tiny"], {"tiny": TINY}, OPTIONS)
    assert listen_ports(plans, "n0") == [9000, 10000]
    assert listen_ports(plans, "n2") == [9002, 10002, 50053]
    assert listen_ports(launch_plans(nodes(3), ["single"], ["tiny"], {"tiny": TINY}, OPTIONS), "n1") == []


def test_host_units_are_flat_and_named():
    plans = launch_plans(nodes(2), ["prima", "llama_rpc"], ["tiny"], {"tiny": TINY}, OPTIONS)
    units = host_units(plans, "n1")
    assert [(unit["name"], unit["role"], unit["rank"]) for unit in units] == [("llama_rpc-tiny", "worker", 1),
                                                                              ("prima-tiny", "worker", 1)]
    assert units[1]["state_dir"] == "/var/lib/prima-bench/prima-tiny"


def render(template, unit, **extra):
    from ansible_collections.prima.cluster.plugins.filter.launch import FilterModule

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(ROOT, "roles", "launch", "templates")),
                             undefined=jinja2.StrictUndefined)
    env.filters["quote"] = __import__("shlex").quote
    env.filters.update({"prima.cluster." + name: function for name, function in FilterModule().filters().items()})
    values = {"unit": unit, "launch_script": "/etc/prima-bench/%s.sh" % unit["name"], "launch_timeout_s": 30,
              "launch_stop_grace_s": 2, "ansible_managed": "test", "launch_systemd": False,
              "launch_unit_name": "prima-bench-%s.service" % unit["name"], "launch_watchdog": WATCHDOG}
    values.update(extra)
    return env.get_template(template).render(**values)


def test_systemd_unit_renders_and_verifies(tmp_path):
    plans = launch_plans(nodes(2), ["llama_rpc"], ["tiny"], {"tiny": TINY}, OPTIONS)
    unit = host_units(plans, "n1")[0]
    text = render("rank.service.j2", unit)
    assert "ExecStart=/etc/prima-bench/llama_rpc-tiny.sh run" in text
    assert "KillMode=control-group" in text and "TimeoutStopSec=2" in text
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed here; the rendered unit was checked by content only")
    script = tmp_path / "llama_rpc-tiny.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    unit_file = tmp_path / "prima-bench-llama_rpc-tiny.service"
    unit_file.write_text(text.replace("/etc/prima-bench/llama_rpc-tiny.sh", str(script))
                         .replace("/var/lib/prima-bench/llama_rpc-tiny", str(tmp_path)))
    verify = subprocess.run(["systemd-analyze", "verify", str(unit_file)], capture_output=True, text=True, check=False)
    assert verify.returncode == 0, verify.stderr


def launcher(tmp_path, argv, listen=(), timeout_s=30, env=None, model="tiny", name="t", stall_s=0):
    unit = {"name": name, "runtime": "single", "role": "head", "rank": 0, "world": 1, "model": model, "argv": argv,
            "env": env if env is not None else {"LLAMA_CACHE": str(tmp_path / "cache")}, "listen": list(listen),
            "state_dir": str(tmp_path / "state"), "stall_s": stall_s}
    script = tmp_path / ("%s.sh" % name)
    script.write_text(render("rank.sh.j2", unit, launch_script=str(script), launch_timeout_s=timeout_s))
    script.chmod(0o755)
    return str(script), tmp_path / "state"


def sh(*argv, cwd=None):
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False, cwd=cwd)


def test_launcher_runs_in_the_foreground_and_keeps_everything(tmp_path):
    script, state = launcher(tmp_path, ["sh", "-c", "echo out; echo err with 'quotes' >&2; echo $LLAMA_CACHE; exit 3"])
    assert sh("bash", "-n", script).returncode == 0
    assert sh(script, "run").returncode == 3
    assert (state / "exit").read_text() == "3\n"
    assert (state / "stdout").read_text() == "out\n%s\n" % (tmp_path / "cache")
    assert (state / "stderr").read_text() == "err with quotes\n"
    assert "echo\\ out" in (state / "command.txt").read_text()
    assert '"running": false' in sh(script, "status").stdout and '"exit": 3' in sh(script, "status").stdout


def test_launcher_times_out_with_124(tmp_path):
    script, state = launcher(tmp_path, ["sleep", "30"], timeout_s=1)
    assert sh(script, "run").returncode == 124 and (state / "exit").read_text() == "124\n"


def test_launcher_finish_packs_the_run(tmp_path):
    import json
    import tarfile

    script, state = launcher(tmp_path, ["sh", "-c", "echo done"])
    assert sh(script, "run").returncode == 0
    done = sh(script, "finish")
    # The rank is gone: looking for its processes prints nothing (bash's own redirection messages).
    assert done.stderr == ""
    finished = json.loads(done.stdout)
    assert finished == {"before": {"running": False, "pid": finished["before"]["pid"], "exit": 0,
                                   "ended": finished["before"]["ended"], "stalled": None}, "left_running": False}
    assert abs(finished["before"]["ended"] - time.time()) < 30
    with tarfile.open(str(state / "run.tar")) as tar:
        assert sorted(tar.getnames()) == ["command.txt", "ended", "exit", "launcher.sh", "stderr", "stdout", "wall_s"]


def test_systemd_flavour_starts_and_stops_through_systemctl(tmp_path):
    plans = launch_plans(nodes(2), ["llama_rpc"], ["tiny"], {"tiny": TINY}, OPTIONS)
    text = render("rank.sh.j2", host_units(plans, "n1")[0], launch_systemd=True)
    assert "systemctl start prima-bench-llama_rpc-tiny.service" in text
    assert "systemctl stop prima-bench-llama_rpc-tiny.service" in text and "setsid" not in text
    assert subprocess.run(["bash", "-n"], input=text, text=True, check=False).returncode == 0


def test_launcher_start_stop_leaves_nothing(tmp_path):
    script, state = launcher(tmp_path, ["sleep", "300"])
    assert sh(script, "start").returncode == 0
    status = sh(script, "status").stdout
    assert '"running": true' in status
    assert sh(script, "start").returncode == 1  # refuses a second copy
    pid = int((state / "child.pid").read_text())
    assert sh(script, "stop").returncode == 0
    assert not os.path.exists("/proc/%d" % pid) or "sleep" not in open("/proc/%d/cmdline" % pid).read()
    assert '"running": false' in sh(script, "status").stdout
    assert not (state / "child.pid").exists() and not (state / "child.start").exists()  # the run cleared them


def test_launcher_stop_kills_what_ignores_sigterm(tmp_path):
    script, state = launcher(tmp_path, ["sh", "-c", "trap '' TERM; sleep 300 & wait; sleep 300"])
    assert sh(script, "start").returncode == 0
    started = sh(script, "stop")
    assert started.returncode == 0, started.stderr
    assert '"running": false' in sh(script, "status").stdout


def test_launcher_listening_fails_fast_when_the_rank_exits(tmp_path):
    script, state = launcher(tmp_path, ["sh", "-c", "echo bad flag >&2; exit 0"], listen=[1])
    assert sh(script, "start").returncode == 0
    waited = sh(script, "listening", "20")
    assert waited.returncode == 1 and "exited with status 0 before listening" in waited.stderr


def test_launcher_listening_sees_a_listener(tmp_path):
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        script, dummy = launcher(tmp_path, ["sleep", "30"], listen=[server.getsockname()[1]])
        assert sh(script, "listening", "5").returncode == 0
    script, dummy = launcher(tmp_path, ["sleep", "30"], listen=[1])
    late = sh(script, "listening", "1")
    assert late.returncode == 1 and "not listening on 1 after 1 s" in late.stderr


def test_through_ssh_every_rank_connects_to_its_own_loopback():
    prima = plan_for("prima", 3, transport="ssh")
    for unit in prima["units"].values():
        argv = unit["argv"]
        assert argv[argv.index("--master") + 1] == "127.0.0.1" and argv[argv.index("--next") + 1] == "127.0.0.1"
    rpc = plan_for("llama_rpc", 3, transport="ssh")
    head = rpc["units"]["n0"]["argv"]
    assert head[head.index("--rpc") + 1] == "127.0.0.1:50052,127.0.0.1:50053"
    assert rpc["units"]["n2"]["argv"][1:5] == ["-H", "127.0.0.1", "-p", "50053"]
    assert rpc["connect_addresses"] == {"n0": "127.0.0.1", "n1": "127.0.0.1", "n2": "127.0.0.1"}
    assert rpc["addresses"]["n2"] == "10.77.0.12" and rpc["transport"] == "ssh"
    with pytest.raises(ValueError, match="transport: 'tunnel' is not direct or ssh"):
        options(transport="tunnel")


def test_env_names_and_values_never_run_as_commands(tmp_path):
    """Issue 12: `export {{ name }}=` ran `A; touch P; B` on every call of the script. The plan refuses such a
    name (and the preflight before it); the script keeps it a word even so."""
    proof = tmp_path / "P"
    env = {"A; touch %s; B" % proof: "1", "OK": "x y\n$(touch %s)'\"" % proof}
    script, state = launcher(tmp_path, ["sh", "-c", 'printf %s "$OK"'], env=env)
    assert sh("bash", "-n", script).returncode == 0
    sh(script, "status")
    assert sh(script, "run").returncode == 0
    assert not proof.exists()
    assert (state / "stdout").read_text() == env["OK"]


@pytest.mark.parametrize("name", ["A\n", "A;B", "1A", "A B", ""])
def test_the_plan_refuses_what_is_not_an_env_name(name):
    with pytest.raises(ValueError, match="not an environment variable name"):
        options(rank_env={name: "1"})


def test_a_model_key_with_a_newline_stays_in_its_comment(tmp_path):
    """Issue 12: a key with a newline (from models_extra_catalog) broke out of the script's comment."""
    model = "m\ntouch injected #"
    script, state = launcher(tmp_path, ["true"], model=model, name="single-" + model, env={})
    assert sh("bash", "-n", script).returncode == 0
    assert sh(script, "status", cwd=str(tmp_path)).returncode == 0
    assert sh(script, "run", cwd=str(tmp_path)).returncode == 0
    assert not (tmp_path / "injected").exists()
    assert "model m\\ntouch injected #." in open(script).read()


def unit_named(tmp_path, model):
    return {"name": "prima-" + model, "runtime": "prima", "role": "worker", "rank": 1, "world": 2, "model": model,
            "argv": ["true"], "env": {}, "listen": [9001], "state_dir": str(tmp_path / "state" / ("prima-" + model))}


@pytest.mark.parametrize("model, refused", [
    ("a b", False), ("50% $HOME", False), ("m'x", True),
    # systemd reads the path back whole, newline and all, then refuses an executable with control characters.
    ("m\nExecStartPre=-touch injected", True), ("m\tx", True)])
def test_systemd_unit_keeps_each_value_on_its_line(tmp_path, model, refused):
    """Issue 12: a key with a space split ExecStart; one with a newline added lines to the unit."""
    unit = unit_named(tmp_path, model)
    script = tmp_path / ("%s.sh" % unit["name"])
    text = render("rank.service.j2", unit, launch_script=str(script))
    lines = text.splitlines()
    assert [line.split("=")[0] for line in lines if "=" in line and not line.startswith("#")] == [
        "Description", "Documentation", "After", "Wants", "Type", "ExecStart", "WorkingDirectory", "KillMode",
        "KillSignal", "TimeoutStopSec", "Restart"]
    assert not any(line.rstrip().endswith("\\") for line in lines)  # no line continues onto the next
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed here; the rendered unit was checked by content only")
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    unit_file = tmp_path / "t.service"
    unit_file.write_text(text)
    verify = subprocess.run(["systemd-analyze", "verify", str(unit_file)], capture_output=True, text=True, check=False)
    if refused:
        assert verify.returncode != 0 and "Executable name contains special characters: %s" % script in verify.stderr
    else:
        assert verify.returncode == 0, verify.stderr


def test_systemd_values_and_comment_lines():
    assert systemd_executable("/etc/prima-bench/prima-tiny.sh") == "/etc/prima-bench/prima-tiny.sh"
    assert systemd_executable('/a b/"$HOME" 50%\\\n') == r'"/a b/\"$HOME\" 50%%\\\n"'
    assert systemd_text("a\nb%\\") == r"a\nb%%\\"
    assert c_escaped("m\r\n\x1b\u2028") == r"m\r\n\x1b\u2028"


def test_the_plan_refuses_unsafe_model_keys_and_file_names():
    for key, entry in (("a b", TINY), ("../x", TINY), ("x\n", TINY),
                       ("ok", {"n_layer": 8, "files": [{"name": "../../etc/x.gguf", "size": 1}]})):
        with pytest.raises(ValueError, match=re.escape("model %r: " % key)):
            launch_plans(nodes(1), ["single"], [key], {key: entry}, OPTIONS)


@pytest.mark.parametrize("window, expected", [
    ("auto", "auto"), ("", "auto"), (None, "auto"), ("prima", "prima"), (" prima ", "prima"), ([3, 3, 2], (3, 3, 2)),
    ("3,3,2", (3, 3, 2)), ("[3, 3, 2]", (3, 3, 2)), (["4", "4"], (4, 4))])
def test_layer_window_option(window, expected):
    assert options(layer_window=window).layer_window == expected


@pytest.mark.parametrize("window", ["fast", [3, 0, 5], [3, True], "3;3", [], {"a": 1}, [2.5, 5.5]])
def test_layer_window_option_refused(window):
    with pytest.raises(ValueError, match="launch option layer_window: .* is not auto, prima, or the layers"):
        options(layer_window=window)


def test_rank_env_never_shadows_the_launchers_own_variables(tmp_path):
    """Review 2: the exports came after state=, script=, timeout_s=: timeout_s "0" removed the hang guard and
    script: /other.sh made `start` run another program. The environment now reaches the rank's process alone."""
    other = tmp_path / "other.sh"
    other.write_text("#!/bin/sh\ntouch %s\n" % (tmp_path / "MARKER"))
    other.chmod(0o755)
    env = {"timeout_s": "0", "script": str(other), "state": str(tmp_path / "elsewhere"), "argv": "x"}
    assert options(rank_env=env).rank_env  # harmless names now: the plan takes them
    script, state = launcher(tmp_path, ["sh", "-c", 'echo "$timeout_s $script"; sleep 3'], timeout_s=1, env=env)
    assert sh(script, "run").returncode == 124 and (state / "exit").read_text() == "124\n"  # the guard holds
    assert (state / "stdout").read_text() == "0 %s\n" % other  # ...and the rank got its variables
    script, state = launcher(tmp_path, ["sleep", "1"], env=env)
    assert sh(script, "start").returncode == 0
    time.sleep(0.5)
    assert not (tmp_path / "MARKER").exists() and not (tmp_path / "elsewhere").exists()
    assert '"running": true' in sh(script, "status").stdout
    assert sh(script, "stop").returncode == 0


def test_shell_variables_in_rank_env_leave_the_launcher_alone(tmp_path):
    """Review 2: with IFS=":" the `for _ in $(seq ...)` loops ran once, so `stop` sent SIGKILL after 0.1 s instead
    of the grace. The launcher keeps its own IFS, PATH and SECONDS; the rank gets the values."""
    env = {"IFS": ":", "PATH": "/nonexistent", "SECONDS": "999999"}
    script, state = launcher(tmp_path, ["/bin/sh", "-c", "trap '/bin/sleep 1; echo graceful >&2; exit 0' TERM; "
                                        "echo \"$PATH\"; /bin/sleep 300 & wait"], env=env)
    assert sh(script, "start").returncode == 0
    time.sleep(1)
    assert '"running": true' in sh(script, "status").stdout
    began = time.time()
    assert sh(script, "stop").returncode == 0
    assert time.time() - began >= 0.9  # the rank's own 1 s of cleanup, within grace_s=2
    assert "graceful" in (state / "stderr").read_text() and (state / "stdout").read_text() == "/nonexistent\n"
    assert (state / "exit").read_text() == "0\n"


@pytest.mark.parametrize("name", ["IFS", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "BASH_FUNC_f",
                                  "BASH_XTRACEFD"])
def test_the_plan_refuses_shell_control_variables(name):
    with pytest.raises(ValueError, match="a shell control variable"):
        options(rank_env={name: "1"})


def test_the_plan_takes_path_and_library_variables():
    """They reach only the rank's process (its CUDA libraries and tools), never the launcher's commands."""
    env = {"PATH": "/usr/local/cuda/bin:/usr/bin", "LD_LIBRARY_PATH": "/usr/local/cuda/lib64", "LD_PRELOAD": "x.so"}
    assert dict(options(rank_env=env).rank_env) == env


def test_a_stale_child_pid_kills_nothing(tmp_path):
    """Review 2: `stop` trusted any child.pid whose cmdline held "timeout" and killed its process group. Our child
    is known by pid, start time (/proc/PID/stat field 22) and argv[0] timeout; the run removes its record."""
    script, state = launcher(tmp_path, ["true"])
    assert sh(script, "run").returncode == 0
    assert not (state / "child.pid").exists() and not (state / "child.start").exists()
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "--read-timeout=30"],
                              start_new_session=True)
    try:
        impostor = subprocess.Popen(["timeout", "300", "sleep", "300"], start_new_session=True)
        try:
            for pid in (victim.pid, impostor.pid):  # a pid reused by another process, even another timeout
                (state / "child.pid").write_text("%d\n" % pid)
                (state / "child.start").write_text("1\n")
                assert sh(script, "stop").returncode == 0
            (state / "child.pid").write_text("%d\n" % victim.pid)  # no start time recorded at all
            (state / "child.start").unlink()
            assert sh(script, "stop").returncode == 0
            time.sleep(0.3)
            assert victim.poll() is None and impostor.poll() is None
            assert '"running": false' in sh(script, "status").stdout
        finally:
            impostor.kill()
            impostor.wait()
    finally:
        victim.kill()
        victim.wait()


def test_a_rank_without_environment_runs(tmp_path):
    """An empty rank_env is an empty array under `set -u` (bash before 4.4 calls that unbound)."""
    script, state = launcher(tmp_path, ["sh", "-c", "echo hi"], env={})
    assert sh(script, "run").returncode == 0 and (state / "stdout").read_text() == "hi\n"


# ---- the stall watchdog (roles/launch/files/rank_watchdog.py, started by rank.sh beside its rank)


def load_watchdog():
    import importlib.util

    spec = importlib.util.spec_from_file_location("rank_watchdog", WATCHDOG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wd = load_watchdog()


def test_the_stall_status_and_words_are_one_definition():
    """The watchdog, the launcher and the bench's judging say the same (the serve side: test_serve_supervisor)."""
    from ansible_collections.prima.cluster.plugins.plugin_utils.bench import run as bench_run
    from ansible_collections.prima.cluster.plugins.plugin_utils.launch import exit_status

    assert wd.STALL_EXIT == exit_status.STALL_EXIT == 119
    assert wd.STALL_WORDS == exit_status.STALL_WORDS
    assert wd.stall_words(3) == bench_run.exit_meaning(119, 3) == "stalled: no output and no traffic for 3 s"
    with open(os.path.join(ROOT, "roles", "launch", "templates", "rank.sh.j2")) as template:
        assert "\nstall_exit=%d " % wd.STALL_EXIT in template.read()
    assert wd.STALL_EXIT not in (0, 1, 124, 125, 126, 127) and not 128 < wd.STALL_EXIT < 128 + 65


def test_the_watchdog_reads_proc_as_the_kernel_writes_it():
    stat = "4242 (llama (cli) x) T 17 4242 4242 0 -1 4194560 10 0 0 0 250 31 0 0 20 0 9 0 123456 1 2 3"
    assert wd.parse_stat(4242, stat) == wd.Process(4242, 17, "T", "123456", "llama (cli) x", 281)
    assert wd.parse_stat(1, "1 (short) S 0") is None
    io = "rchar: 10\nwchar: 20\nsyscr: 3\nsyscw: 4\nread_bytes: 4096\nwrite_bytes: 0\ncancelled_write_bytes: 0\n"
    assert wd.parse_io(io) == (10, 20, 4096, 0)
    tree = [wd.Process(pid, ppid, "S", "1", "x", 0) for pid, ppid in [(10, 1), (11, 10), (12, 11), (13, 1), (14, 12)]]
    assert sorted(wd.descendants(10, tree)) == [10, 11, 12, 14]


def test_what_counts_as_traffic():
    quiet = wd.Sample((10, 20), (1, 2, 3, 4), {7: 100, 8: 0}, None)
    assert not wd.moved(quiet, quiet)
    assert wd.moved(quiet, quiet._replace(outputs=(10, 21)))  # a dot of llama.cpp's load
    assert wd.moved(quiet, quiet._replace(io=(1, 2, 4099, 4)))  # weights paged in from the mmap
    assert wd.moved(quiet, quiet._replace(sockets={7: 101, 8: 0}))  # a token through the ring
    assert wd.moved(quiet, quiet._replace(sockets={7: 100, 8: 0, 9: 5}))  # a new connection that carried bytes
    # A ZeroMQ peer redialling a dead rank: sockets come and go, empty, and one that closed took its bytes along.
    assert not wd.moved(quiet, quiet._replace(sockets={8: 0, 9: 0}))
    assert wd.moved(quiet._replace(cpu=5), quiet._replace(cpu=6))  # no sock_diag: CPU time stands in


def test_socket_bytes_come_from_the_kernel_by_inode():
    """send(2) and recv(2) count in no /proc/PID/io counter: the watchdog reads them from tcp_info."""
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname()) as client:
            peer, dummy = server.accept()
            with peer:
                before = wd.tcp_bytes()
                client.sendall(b"x" * 5000)
                assert len(peer.recv(10000)) > 0
                time.sleep(0.1)
                after = wd.tcp_bytes()
                inodes = (os.fstat(client.fileno()).st_ino, os.fstat(peer.fileno()).st_ino)
                assert all(after[inode] >= before.get(inode, 0) + 1 for inode in inodes)
                assert after[inodes[0]] - before.get(inodes[0], 0) >= 5000
                assert wd.socket_inodes(os.getpid()) >= set(inodes)


def gone(pid):
    """No such process, or a zombie: the rank's parent `timeout` was killed with it, so whoever reaps orphans
    here reaps it (or not)."""
    try:
        with open("/proc/%d/stat" % pid) as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def running_with(text):
    """Pids of processes whose command line holds `text` (a state directory is unique to its test)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as cmdline:
                if entry.isdigit() and text.encode() in cmdline.read() and not gone(int(entry)):
                    found.append(int(entry))
        except OSError:
            continue
    return found


STALLS = {
    # prints, then SIGSTOP: SIGTERM would wait for a SIGCONT, the watchdog's SIGKILL does not
    "stopped": "import os, signal, sys; print('loaded', flush=True); open(sys.argv[1], 'w').write(str(os.getpid()));"
               " os.kill(os.getpid(), signal.SIGSTOP)",
    # blocked for good, as in a recv from a peer behind a cut network
    "silent": "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)",
}


@pytest.mark.parametrize("kind", sorted(STALLS))
def test_a_rank_quiet_for_stall_s_is_killed_and_the_cause_recorded(tmp_path, kind):
    pid_file = tmp_path / "program.pid"
    script, state = launcher(tmp_path, [sys.executable, "-c", STALLS[kind], str(pid_file)], stall_s=3)
    began = time.monotonic()
    done = sh(script, "run")
    took = time.monotonic() - began
    assert done.returncode == 119, (done.stderr, (state / "watchdog.log").read_text())
    assert 3 <= took < 3 + 3 + 4  # stall_s, then at most one poll (min(5, stall_s)), and some slack
    assert (state / "exit").read_text() == "119\n"
    lines = (state / "stalled").read_text().splitlines()
    assert lines[0] == "3" and lines[1].startswith("stalled: no output and no traffic for 3 s; quiet for ")
    if kind == "stopped":
        assert "stopped" in lines[1]
    status = json.loads(sh(script, "status").stdout)
    assert status["exit"] == 119 and status["stalled"] == 3 and status["running"] is False
    assert gone(int(pid_file.read_text()))
    assert running_with(str(state)) == []  # the rank, its timeout and the watchdog: all gone
    finished = json.loads(sh(script, "finish").stdout)
    assert finished["before"]["stalled"] == 3 and not finished["left_running"]
    import tarfile

    with tarfile.open(str(state / "run.tar")) as tar:
        assert "stalled" in tar.getnames()


BUSY = {
    # a line every second: a slow load that says where it is
    "prints": "import time\nfor n in range(7):\n    print('.', end='', flush=True)\n    time.sleep(1)\n",
    # reads a file slowly and says nothing: weights paged in
    "reads": "import os, time\nfd = os.open(__import__('sys').executable, os.O_RDONLY)\nfor n in range(7):\n"
             "    os.read(fd, 4096)\n    time.sleep(1)\n",
    # only TCP traffic, which /proc/PID/io does not count: a worker busy with the ring
    "sockets": "import socket, time\nserver = socket.socket()\nserver.bind(('127.0.0.1', 0))\nserver.listen(1)\n"
               "client = socket.create_connection(server.getsockname())\npeer = server.accept()[0]\n"
               "for n in range(7):\n    client.send(b'x' * 100)\n    peer.recv(100)\n    time.sleep(1)\n",
}


@pytest.mark.parametrize("kind", sorted(BUSY))
def test_a_rank_busy_within_the_window_is_left_alone(tmp_path, kind):
    script, state = launcher(tmp_path, [sys.executable, "-c", BUSY[kind]], stall_s=3)
    done = sh(script, "run")
    assert done.returncode == 0, ((state / "stalled").read_text() if (state / "stalled").exists() else "",
                                  (state / "stderr").read_text(), (state / "watchdog.log").read_text())
    assert not (state / "stalled").exists() and (state / "watchdog.log").read_text() == ""
    assert json.loads(sh(script, "status").stdout)["stalled"] is None
    assert running_with(str(state)) == []


def test_no_watchdog_with_stall_s_0_and_none_left_after_a_stop(tmp_path):
    script, state = launcher(tmp_path, ["sleep", "300"])
    assert "stall_s=0 " in open(script).read()
    assert sh(script, "start").returncode == 0
    time.sleep(0.5)
    assert [pid for pid in running_with(str(state)) if "rank_watchdog" in open("/proc/%d/cmdline" % pid).read()] == []
    assert sh(script, "stop").returncode == 0
    script, state = launcher(tmp_path, ["sleep", "300"], stall_s=60, name="u")
    assert sh(script, "start").returncode == 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(
            "rank_watchdog" in open("/proc/%d/cmdline" % pid).read() for pid in running_with(str(state))):
        time.sleep(0.1)
    assert any("rank_watchdog" in open("/proc/%d/cmdline" % pid).read() for pid in running_with(str(state)))
    assert sh(script, "stop").returncode == 0
    time.sleep(0.3)
    assert running_with(str(state)) == []
    assert (state / "exit").read_text() == "143\n" and not (state / "stalled").exists()


def test_the_plan_gives_each_unit_its_stall_watchdog():
    assert {unit["stall_s"] for unit in plan_for("prima", 3)["units"].values()} == {120}
    assert {unit["stall_s"] for unit in plan_for("llama_rpc", 2, stall_s="30")["units"].values()} == {30}
    # A served ring idles between requests without a byte moving: no watchdog unless asked for.
    served = launch_plans(nodes(2), ["prima"], ["tiny"], {"tiny": TINY},
                          options(server=True, server_port="8080"))["serve-prima-tiny"]
    assert {unit["stall_s"] for unit in served["units"].values()} == {0}
    served = launch_plans(nodes(2), ["prima"], ["tiny"], {"tiny": TINY},
                          options(server=True, server_port="8080", server_stall_s="600"))["serve-prima-tiny"]
    assert {unit["stall_s"] for unit in served["units"].values()} == {600}
    assert options(stall_s=0).stall_s == 0 and options(stall_s=2.0).stall_s == 2


@pytest.mark.parametrize("value", [-1, "-5", "two minutes", True, 1.5, None, ""])
def test_a_stall_that_is_not_whole_seconds_is_refused_by_the_plan_and_the_preflight(value):
    from ansible_collections.prima.cluster.plugins.plugin_utils.preflight.checks import stall_problems

    with pytest.raises(ValueError, match="launch option stall_s: launch_stall_s .* is not a whole number of seconds"):
        options(stall_s=value)
    hostvars = {"n0": {"launch_stall_s": value}, "n1": {"launch_stall_s": value, "launch_server_stall_s": 5},
                "n2": {}}
    assert stall_problems(["n0", "n1", "n2"], hostvars) == [
        "hosts n0, n1: launch_stall_s %r is not a whole number of seconds >= 0; pass -e launch_stall_s=120 (0 turns "
        "the stall watchdog off)" % (value,)]
    assert stall_problems(["n0"], {"n0": {"launch_server_stall_s": "-1"}})[0].startswith(
        "host n0: launch_server_stall_s '-1' is not a whole number")
    assert stall_problems(["n0"], {"n0": {"launch_stall_s": "0", "launch_server_stall_s": 600}}) == []
