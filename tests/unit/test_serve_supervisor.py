"""The serve supervisor (roles/serve/files/serve_supervisor.py) and the peers' forced command
(roles/serve/templates/peer.sh.j2): the small decisions as pure functions, then a real ring on localhost whose ranks are
rendered launcher scripts (roles/launch/templates/rank.sh.j2), the workers reached through the real peer script."""

import http.server
import importlib.util
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import jinja2
import pytest

from test_launch import render

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUPERVISOR = os.path.join(ROOT, "roles", "serve", "files", "serve_supervisor.py")
UNIT = "serve-llama_rpc-tiny"


def load_supervisor():
    spec = importlib.util.spec_from_file_location("serve_supervisor", SUPERVISOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sv = load_supervisor()


def rank(number, host="n0", control=("x",)):
    return {"rank": number, "host": host, "role": "head" if number == 0 else "worker", "control": list(control)}


def base_config(**overrides):
    config = {"name": UNIT, "state_file": "/tmp/s.json", "pid_file": "/tmp/s.pid", "health_url": "http://h/health",
              "ranks": [rank(0), rank(1, "n1")]}
    config.update(overrides)
    return config


# ---- pure functions


def test_backoff_doubles_from_base_up_to_the_cap():
    assert [sv.backoff_delay(n, 5, 120) for n in range(0, 8)] == [0.0, 5, 10, 20, 40, 80, 120, 120]
    assert sv.backoff_delay(1, 0.2, 1) == 0.2 and sv.backoff_delay(10 ** 6, 0.2, 1) == 1


def test_config_gets_defaults_and_refuses_what_cannot_run():
    config = sv.check_config(base_config(backoff_s=0.2))
    assert config["restarts"] == 3 and config["control_timeout_s"] == 30 and config["backoff_s"] == 0.2
    for bad, says in [(base_config(ranks=[rank(1)]), "ranks must be 0..0"),
                      (base_config(ranks=[rank(0), dict(rank(1), control=[])]), "control argv"),
                      (base_config(restarts=-1), "restarts"), (base_config(backoff_s="5"), "backoff_s"),
                      ({"name": UNIT}, "lacks state_file, pid_file, ranks, health_url"), ([], "not a JSON object")]:
        with pytest.raises(ValueError, match=says):
            sv.check_config(bad)


def test_workers_start_from_the_highest_rank_and_the_head_stops_first():
    ranks = [rank(1), rank(0), rank(3), rank(2)]
    assert [r["rank"] for r in sv.workers_start_order(ranks)] == [3, 2, 1]
    assert [r["rank"] for r in sv.stop_order(ranks)] == [0, 1, 2, 3]


def test_status_lines_and_what_an_ended_wait_means():
    line = '{"running": false, "pid": 12, "exit": 137, "ended": 1.5}'
    assert sv.parse_status("noise\n" + line + "\n") == json.loads(line)
    assert sv.parse_status("") is None and sv.parse_status("[1]\n{\"a\": 1}") is None
    assert sv.watch_outcome(json.loads(line), 0, "ssh") == (
        137, "exited with status 137: killed (SIGKILL), by kill -9 or the OOM killer")
    assert sv.watch_outcome(None, 255, "ssh") == (None, "lost contact: ssh exited 255")
    assert sv.watch_outcome({"running": False, "exit": None}, 0, "ssh")[0] is None


def test_health_needs_200_and_status_ok():
    assert sv.health_ok(200, '{"status": "ok"}')
    assert not sv.health_ok(503, '{"error": {"code": 503, "message": "Loading model"}}')
    assert not sv.health_ok(200, "not json") and not sv.health_ok(None, "refused") and not sv.health_ok(200, "[]")


def test_control_problems_read_plainly():
    result = sv.ControlResult(1, "", "exited with status 3 before listening\n")
    assert sv.control_problem("listening", result, 150, "bash") == "`listening` exited 1: exited with status 3 " \
                                                                   "before listening"
    assert sv.control_problem("stop", sv.ControlResult(None, "", "", timed_out=True), 30, "ssh") == \
        "`stop` timed out after 30 s"
    assert sv.control_problem("start", sv.ControlResult(255, "", "Connection refused\n"), 30, "ssh") == \
        "lost contact: ssh exited 255 (`start`): Connection refused"


def test_failures_count_restarts_until_the_ring_has_failed():
    state = sv.initial_state(sv.check_config(base_config(restarts=1)), 42, "2024-01-01T00:00:00Z")
    state = sv.ring_running(sv.generation_started(state, "2024-01-01T00:00:01Z"), "2024-01-01T00:00:02Z")
    assert (state["state"], state["generation"], state["since"]) == ("running", 1, "2024-01-01T00:00:02Z")
    failure = sv.failure_record(rank(1, "n1"), 137, "exited with status 137", ["bye"], "2024-01-01T00:00:03Z", 1,
                                "running")
    assert failure == {"rank": 1, "host": "n1", "role": "worker", "exit": 137, "stderr_tail": ["bye"],
                       "at": "2024-01-01T00:00:03Z", "generation": 1, "phase": "running",
                       "message": "rank 1 (worker on n1): exited with status 137", "stalled_s": None}
    restarting = sv.failure_recorded(state, failure, 5, 120, 1704067203.0)
    assert (restarting["state"], restarting["restarts"], restarting["since"]) == ("restarting", 1, None)
    assert restarting["next_start"] == "2024-01-01T00:00:08Z" and restarting["last_failure"] == failure
    failed = sv.failure_recorded(restarting, failure, 5, 120, 1704067210.0)
    assert (failed["state"], failed["restarts"], failed["next_start"]) == ("failed", 1, None)
    assert len(failed["failures"]) == 2
    many = dict(state, max_restarts=100)
    for number in range(15):
        many = sv.failure_recorded(many, dict(failure, generation=number), 5, 120, 0.0)
    assert [f["generation"] for f in many["failures"]] == list(range(5, 15))
    assert sorted(state) == ["failures", "generation", "health_url", "last_failure", "max_restarts", "model", "name",
                             "next_start", "pid", "restarts", "runtime", "since", "state", "stop",
                             "supervisor_started", "updated"]


def test_a_stop_is_judged_by_each_rank_exit():
    clean = [0, 143, 139]
    head = sv.judge_stop(rank(0), True, "", {"running": False, "exit": 139}, clean)
    assert head == {"rank": 0, "host": "n0", "exit": 139, "clean": True, "note": sv.HEAD_EXIT_139_NOTE}
    assert sv.judge_stop(rank(1), True, "", {"running": False, "exit": 143}, clean)["note"] == ""
    assert not sv.judge_stop(rank(1), True, "", {"running": False, "exit": 1}, clean)["clean"]
    assert sv.judge_stop(rank(1), False, "", {"running": False, "exit": 137}, clean)["clean"]  # an older run's exit
    left = sv.judge_stop(rank(1), True, "`stop` exited 1", None, clean)
    assert not left["clean"] and left["note"].startswith("could not be stopped")
    assert sv.stop_summary([head, left]) == {"clean": False, "ranks": [head, left]}


def test_state_file_is_written_whole_and_readable(tmp_path):
    path = str(tmp_path / "deep" / "state.json")
    sv.atomic_write(path, '{"state": "running"}\n')
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
    assert sv.read_state(path) == ({"state": "running"}, "")
    assert os.listdir(str(tmp_path / "deep")) == ["state.json"]


def test_status_command_survives_a_missing_or_corrupt_state_file(tmp_path):
    state = tmp_path / "state.json"
    config = tmp_path / "config.json"
    config.write_text(json.dumps(base_config(state_file=str(state), pid_file=str(tmp_path / "pid"))))

    def status():
        done = subprocess.run([sys.executable, SUPERVISOR, "status", str(config)], capture_output=True, text=True,
                              timeout=30, check=False)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert status() == {"name": UNIT, "state": "unknown", "alive": False, "error": status()["error"]}
    state.write_text("{half")
    assert status()["state"] == "unknown" and "not JSON" in status()["error"]
    state.write_text(json.dumps({"state": "running", "pid": os.getpid()}))
    assert status() == {"state": "running", "pid": os.getpid(), "alive": False}  # pytest is no supervisor


def test_a_pid_of_another_units_supervisor_is_not_this_units_and_is_never_stopped(tmp_path):
    """A reused pid may be another unit's supervisor: its argv names serve_supervisor.py but another config."""
    mine, other = tmp_path / "mine" / "config.json", tmp_path / "other" / "config.json"
    for path in (mine, other):
        path.parent.mkdir()
        path.write_text(json.dumps(base_config(state_file=str(path.parent / "state.json"),
                                               pid_file=str(path.parent / "supervisor.pid"))))
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)", "/opt/prima/serve_supervisor.py", "run"]
    others = subprocess.Popen(sleeper + [str(other)])
    relative = subprocess.Popen(sleeper + ["config.json"], cwd=str(mine.parent))  # as started by hand
    try:
        for process in (others, relative):
            deadline = time.monotonic() + 5
            while b"serve_supervisor" not in open("/proc/%d/cmdline" % process.pid, "rb").read():
                assert time.monotonic() < deadline, "the sleeper never showed its command line"
                time.sleep(0.01)
        assert sv.supervisor_alive(others.pid, str(other)) and not sv.supervisor_alive(others.pid, str(mine))
        assert sv.supervisor_alive(relative.pid, str(mine)) and not sv.supervisor_alive(relative.pid, str(other))
        assert not sv.supervisor_alive(os.getpid(), str(mine))
        (mine.parent / "supervisor.pid").write_text("%d\n" % others.pid)
        done = subprocess.run([sys.executable, SUPERVISOR, "stop", str(mine)], capture_output=True, text=True,
                              timeout=30, check=False)
        assert done.returncode == 0 and json.loads(done.stdout)["alive"] is False, (done.stdout, done.stderr)
        assert others.poll() is None, "stop of one unit SIGTERMed another unit's supervisor"
    finally:
        for process in (others, relative):
            process.kill()
            process.wait()


# ---- the peers' forced command


def render_peer(path, units):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(ROOT, "roles", "serve", "templates")),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True)  # as Ansible renders
    env.filters["quote"] = __import__("shlex").quote
    path.write_text(env.get_template("peer.sh.j2").render(serve_peer_units=units, ansible_managed="test"))
    return str(path)


@pytest.fixture
def peer(tmp_path):
    target = tmp_path / "rank1.sh"
    target.write_text('#!/bin/bash\necho "ran $*"\n')
    target.chmod(0o755)
    script = render_peer(tmp_path / "peer.sh", [{"name": UNIT, "script": str(target)},
                                                {"name": "serve-prima-x", "script": "/nonexistent it's"}])

    def ask(command):
        env = dict(os.environ, SSH_ORIGINAL_COMMAND=command)
        return subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=30, check=False,
                              cwd=str(tmp_path))
    return ask


def test_peer_runs_the_allowed_verbs(peer):
    for command, ran in [(UNIT + " status", "ran status"), (UNIT + " wait", "ran wait"),
                         (UNIT + "  listening\t120", "ran listening 120"), (UNIT + " tail 20", "ran tail 20")]:
        done = peer(command)
        assert (done.returncode, done.stdout, done.stderr) == (0, ran + "\n", "")


@pytest.mark.parametrize("command", [UNIT + " start; touch CANARY", UNIT + " start && touch CANARY",
                                     "serve-unknown start", UNIT + " clear", UNIT + " run", UNIT + " tail x",
                                     UNIT + " tail 1234567", UNIT + " listening", UNIT + " stop 5",
                                     UNIT + " tail $(touch CANARY)", UNIT + " start\ntouch CANARY",
                                     UNIT + " start\rtouch", "", "*", UNIT + " tail 1 2"])
def test_peer_refuses_anything_else(peer, tmp_path, command):
    done = peer(command)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("refused ") and done.stderr.count("\n") == 1 and UNIT in done.stderr
    assert "allowed: UNIT start|stop|status|wait" in done.stderr
    assert not (tmp_path / "CANARY").exists()


# ---- a real ring on localhost

HEAD_PROGRAM = r'''
import http.server, json, sys, time
port, ready_after = int(sys.argv[1]), float(sys.argv[2])
ready_at = time.monotonic() + ready_after


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ready = time.monotonic() >= ready_at
        body = json.dumps({"status": "ok"} if ready else {"error": {"code": 503, "message": "Loading model"}})
        self.send_response(200 if ready else 503)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", port), Health)
print("head loading on port %d" % port, file=sys.stderr, flush=True)
server.serve_forever()
'''
WORKER_PROGRAM = r'''
import socket, sys, time
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", int(sys.argv[1])))
listener.listen()
print("worker ready on port %s" % sys.argv[1], file=sys.stderr, flush=True)
time.sleep(1000)
'''
SSHD_STAND_IN = '#!/bin/bash\n# what sshd does with a forced command: the request goes in SSH_ORIGINAL_COMMAND\n' \
                'SSH_ORIGINAL_COMMAND="$*" exec bash %s\n'


def free_port():
    """A port below the ephemeral range: one the kernel hands out for outgoing connections (the suite beside
    this one makes many) can be taken again, or left in TIME_WAIT, before the rank binds it."""
    low, dummy = (int(part) for part in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    while True:
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def sh(*argv):
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)


class Ring:
    """Three ranks on this machine: the head local, ranks 1 and 2 each behind its own peer script (a node each)."""

    def __init__(self, tmp_path, head_ready_after=1.0, stall_s=None, **overrides):
        self.tmp = tmp_path
        (tmp_path / "head.py").write_text(HEAD_PROGRAM)
        (tmp_path / "worker.py").write_text(WORKER_PROGRAM)
        self.scripts, self.state_dirs, ranks = [], [], []
        self.ports = [free_port() for dummy in range(3)]
        for number, port in enumerate(self.ports):
            program = [str(tmp_path / "head.py"), str(port), str(head_ready_after)] if number == 0 else \
                [str(tmp_path / "worker.py"), str(port)]
            unit = {"name": "%s-rank%d" % (UNIT, number), "runtime": "llama_rpc", "model": "tiny",
                    "role": "head" if number == 0 else "worker", "rank": number, "world": 3,
                    "argv": [sys.executable] + program, "env": {}, "listen": [port],
                    "state_dir": str(tmp_path / ("rank%d" % number)), "stall_s": (stall_s or {}).get(number, 0)}
            script = tmp_path / ("%s-rank%d.sh" % (UNIT, number))
            script.write_text(render("rank.sh.j2", unit, launch_script=str(script), launch_timeout_s=300))
            script.chmod(0o755)
            self.scripts.append(str(script))
            self.state_dirs.append(tmp_path / ("rank%d" % number))
            if number == 0:
                control = [str(script)]
            else:
                peer = render_peer(tmp_path / ("peer%d.sh" % number), [{"name": UNIT, "script": str(script)}])
                stand_in = tmp_path / ("sshd%d.sh" % number)
                stand_in.write_text(SSHD_STAND_IN % peer)
                control = ["bash", str(stand_in), UNIT]
            ranks.append({"rank": number, "host": "n%d" % number, "role": unit["role"], "control": control})
        self.state_file = tmp_path / "state" / "supervisor.json"
        self.pid_file = tmp_path / "state" / "supervisor.pid"
        self.config = {"name": UNIT, "runtime": "llama_rpc", "model": "tiny", "state_file": str(self.state_file),
                       "pid_file": str(self.pid_file), "ranks": ranks,
                       "health_url": "http://127.0.0.1:%d/health" % self.ports[0], "listen_timeout_s": 20,
                       "load_timeout_s": 20, "restarts": 3, "backoff_s": 0.2, "backoff_max_s": 1,
                       "clean_stop_exits": [0, 143, 139], "stderr_tail_lines": 20, "control_timeout_s": 15}
        self.config.update(overrides)
        self.config_file = tmp_path / "config.json"
        self.config_file.write_text(json.dumps(self.config))
        self.log = tmp_path / "supervisor.log"
        self.process = None

    def start(self):
        with open(str(self.log), "w") as log:
            self.process = subprocess.Popen([sys.executable, SUPERVISOR, "run", str(self.config_file)], stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        return self

    def state(self):
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def wait_state(self, predicate, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state()
            if state and predicate(state):
                return state
            assert self.process.poll() is None or predicate(self.state()), self.log.read_text()
            time.sleep(0.1)
        raise AssertionError("state %s after %s s\n%s" % (self.state(), timeout, self.log.read_text()))

    def program_pid(self, number):
        """The rank's own program: the child of the `timeout` whose pid rank.sh keeps."""
        wrapper = int((self.state_dirs[number] / "child.pid").read_text())
        with open("/proc/%d/task/%d/children" % (wrapper, wrapper)) as children:
            return int(children.read().split()[0])

    def nothing_running(self):
        return all(json.loads(sh(script, "status").stdout)["running"] is False for script in self.scripts)

    def close(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        if self.process:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                pass
            self.process.wait()
        for script in self.scripts:  # the ranks run in sessions of their own: the group kill above misses them
            sh(script, "stop")


@pytest.fixture
def ring(tmp_path):
    rings = []

    def make(head_ready_after=1.0, **overrides):
        rings.append(Ring(tmp_path, head_ready_after, **overrides))
        return rings[-1]
    yield make
    for each in rings:
        each.close()


def test_ring_comes_up_and_stops_clean_on_sigterm(ring):
    up = ring().start()
    state = up.wait_state(lambda s: s["state"] == "running")
    assert (state["generation"], state["restarts"], state["pid"]) == (1, 0, up.process.pid)
    assert state["since"] and state["stop"] is None and int(up.pid_file.read_text()) == up.process.pid
    assert up.nothing_running() is False
    pids = [up.program_pid(number) for number in range(3)]
    log = up.log.read_text()
    assert log.index("started rank 2") < log.index("started rank 1") < log.index("started rank 0")

    second = subprocess.run([sys.executable, SUPERVISOR, "run", str(up.config_file)], capture_output=True, text=True,
                            timeout=30, check=False)
    assert second.returncode == 2 and "another supervisor runs for this unit" in second.stderr
    status = json.loads(sh(sys.executable, SUPERVISOR, "status", str(up.config_file)).stdout)
    assert status["alive"] is True and status["state"] == "running"

    up.process.send_signal(signal.SIGTERM)
    assert up.process.wait(timeout=30) == 0, up.log.read_text()
    state = up.state()
    assert state["state"] == "stopped" and state["since"] is None
    assert state["stop"] == {"clean": True, "ranks": [{"rank": number, "host": "n%d" % number, "exit": 143,
                                                       "clean": True, "note": ""} for number in range(3)]}
    assert not up.pid_file.exists() and up.nothing_running()
    assert not any(os.path.exists("/proc/%d" % pid) for pid in pids)
    assert json.loads(sh(sys.executable, SUPERVISOR, "status", str(up.config_file)).stdout)["alive"] is False


def test_a_killed_worker_restarts_the_whole_ring(ring):
    up = ring().start()
    up.wait_state(lambda s: s["state"] == "running")
    head_before = up.program_pid(0)
    os.kill(up.program_pid(1), signal.SIGKILL)
    state = up.wait_state(lambda s: s["state"] == "running" and s["generation"] == 2)
    assert state["restarts"] == 1 and len(state["failures"]) == 1
    failure = state["last_failure"]
    assert (failure["rank"], failure["host"], failure["role"], failure["exit"]) == (1, "n1", "worker", 137)
    assert (failure["generation"], failure["phase"]) == (1, "running")
    assert failure["message"] == ("rank 1 (worker on n1): exited with status 137: killed (SIGKILL), by kill -9 or "
                                  "the OOM killer")
    assert failure["stderr_tail"] == ["worker ready on port %d" % up.ports[1]]
    assert "restarting (1 of 3) in 0.2 s" in up.log.read_text()
    assert not os.path.exists("/proc/%d" % head_before)  # the head was restarted too


def test_used_up_restarts_fail_the_ring_and_leave_nothing(ring):
    up = ring(restarts=0).start()
    up.wait_state(lambda s: s["state"] == "running")
    pids = [up.program_pid(number) for number in range(3)]
    os.kill(pids[2], signal.SIGKILL)
    assert up.process.wait(timeout=30) == 1, up.log.read_text()
    state = up.state()
    assert (state["state"], state["restarts"], state["max_restarts"]) == ("failed", 0, 0)
    assert (state["last_failure"]["rank"], state["last_failure"]["exit"]) == (2, 137)
    assert "rank 2 (worker on n2)" in state["last_failure"]["message"]
    assert not up.pid_file.exists() and up.nothing_running()
    assert not any(os.path.exists("/proc/%d" % pid) for pid in pids)


def test_a_worker_that_never_listens_is_a_start_failure(ring, tmp_path):
    up = ring(restarts=0, listen_timeout_s=1)
    (tmp_path / "worker.py").write_text("import sys\nprint('bad flag', file=sys.stderr)\nsys.exit(3)\n")
    up.start()
    assert up.process.wait(timeout=30) == 1, up.log.read_text()
    failure = up.state()["last_failure"]
    assert (failure["rank"], failure["exit"], failure["phase"]) == (2, 3, "starting")
    assert failure["stderr_tail"] == ["bad flag"]
    assert "`listening` exited 1: exited with status 3 before listening" in failure["message"]
    assert up.nothing_running()


def test_sigterm_while_the_head_loads_stops_everything_started(ring):
    up = ring(head_ready_after=60).start()
    up.wait_state(lambda s: s["state"] == "starting" and "started rank 0" in up.log.read_text())
    up.process.send_signal(signal.SIGTERM)
    assert up.process.wait(timeout=30) == 0, up.log.read_text()
    state = up.state()
    assert state["state"] == "stopped" and state["stop"]["clean"] and state["last_failure"] is None
    assert [entry["exit"] for entry in state["stop"]["ranks"]] == [143, 143, 143]
    assert up.nothing_running()


def test_start_detaches_and_returns_once_running_state_is_written_then_stop_waits_for_a_clean_end(ring):
    up = ring()
    started = sh(sys.executable, SUPERVISOR, "start", str(up.config_file))
    assert started.returncode == 0, started.stderr
    pid = json.loads(started.stdout)["started"]
    try:
        assert up.state()["pid"] == pid
        up.process = None
        deadline = time.monotonic() + 20
        while up.state().get("state") != "running" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert up.state()["state"] == "running"
        again = sh(sys.executable, SUPERVISOR, "start", str(up.config_file))
        assert again.returncode == 2 and "another supervisor runs for this unit: pid %d" % pid in again.stderr
        stopped = sh(sys.executable, SUPERVISOR, "stop", str(up.config_file))
        assert stopped.returncode == 0, stopped.stderr
        report = json.loads(stopped.stdout)
        assert report["state"] == "stopped" and report["stop"]["clean"] and report["alive"] is False
        assert up.nothing_running() and gone(pid)
        assert "stopped, clean" in (up.state_file.parent / "supervisor.log").read_text()
        # Nothing runs: stop says so and succeeds.
        assert sh(sys.executable, SUPERVISOR, "stop", str(up.config_file)).returncode == 0
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def gone(pid):
    """No such process, or a zombie: `start` detached it, so whoever reaps orphans here reaps it (or not)."""
    try:
        with open("/proc/%d/stat" % pid) as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_free_says_whether_anything_still_listens_on_the_servers_port_on_any_address(tmp_path):
    sv = load_supervisor()
    with socket.socket() as listener:
        listener.bind(("127.0.0.2", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        assert sv.port_listening(port)
        config = tmp_path / "config.json"
        config.write_text(json.dumps(base_config(health_url="http://127.0.0.1:%d/health" % port)))
        busy = sh(sys.executable, SUPERVISOR, "free", str(config))
        assert busy.returncode == 1 and "port %d is still listened on" % port in busy.stderr
    assert not sv.port_listening(port)
    assert sh(sys.executable, SUPERVISOR, "free", str(config)).returncode == 0


@pytest.mark.parametrize("raw, words", [
    ({"ranks": ["x"]}, "each rank is an object"),
    ({"health_url": 7}, "health_url: a non-empty string"),
    ({"health_url": "file:///etc/passwd"}, "an http:// URL"),
    ({"clean_stop_exits": "0"}, "clean_stop_exits: a list"),
])
def test_a_config_of_the_wrong_types_is_refused_in_words(raw, words):
    with pytest.raises(ValueError, match=words):
        load_supervisor().check_config(dict(base_config(), **raw))


def test_a_ring_that_served_for_stable_s_gets_its_restarts_back():
    sv = load_supervisor()
    state = dict(sv.initial_state(base_config(restarts=1), 1, "2024-01-01T00:00:00Z"), restarts=1)
    failure = {"rank": 1}
    assert sv.failure_recorded(state, failure, 5, 120, 1704067200.0, 10, 600)["state"] == "failed"
    again = sv.failure_recorded(state, failure, 5, 120, 1704067200.0, 601, 600)
    assert (again["state"], again["restarts"]) == ("restarting", 1)


# ---- /health within its deadline, whatever the head sends

TRICKLE_S = 6.0  # how long a trickling head goes on at most: far past the deadlines given here


class Trickler(http.server.BaseHTTPRequestHandler):
    """A head whose /health answer never ends: a status line, then a header a byte every 0.1 s."""

    def do_GET(self):
        try:
            self.wfile.write(b"HTTP/1.0 200 OK\r\nX-Slow: ")
            for dummy in range(int(TRICKLE_S / 0.1)):
                time.sleep(0.1)
                self.wfile.write(b"x")
        except OSError:
            pass  # the supervisor has gone

    def log_message(self, *args):
        pass


@pytest.fixture
def trickling_health():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield "http://127.0.0.1:%d/health" % server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_health_probe_ends_at_its_deadline_whatever_the_head_trickles(trickling_health):
    started = time.monotonic()
    assert sv.probe_health(trickling_health, 1.0) == (None, "no complete answer within 1 s")
    assert 1.0 <= time.monotonic() - started < 2.0
    assert sv.probe_health("http://127.0.0.1:%d/health" % free_port(), 1.0)[0] is None  # refused: no answer


def test_sigterm_while_the_head_trickles_its_health_ends_the_wait(trickling_health, monkeypatch, tmp_path):
    monkeypatch.setattr(sv, "HEALTH_TRY_TIMEOUT_S", 1.0)
    monkeypatch.setattr(sv, "HEAD_STATUS_EVERY_S", 60.0)  # no rank to ask: only the probe and the signal count
    supervisor = sv.Supervisor(sv.check_config(base_config(health_url=trickling_health,
                                                           state_file=str(tmp_path / "s.json"))))
    threading.Timer(0.2, supervisor.request_stop, (signal.SIGTERM, None)).start()
    started = time.monotonic()
    with pytest.raises(sv.StopRequested):
        supervisor.await_health(supervisor.ranks[0])
    # The probe under way ends at its deadline (1 s), the next check of the signal follows its pause (0.5 s).
    assert time.monotonic() - started < 1.0 + sv.HEALTH_POLL_S + 0.5


def test_a_health_answer_nested_too_deep_is_not_ok():
    assert not sv.health_ok(200, "[" * 100000) and not sv.health_ok(200, '{"status": ' * 100000)


def test_the_health_probes_watchdog_is_the_load_clients():
    """One rule, one definition: the supervisor stands alone on the node, so it holds a copy, held equal here."""
    def class_text(path, name):
        with open(path) as handle:
            text = handle.read()
        start = text.index("\nclass %s:" % name)
        return text[start:text.index("\n\n\n", start)]

    client = os.path.join(ROOT, "plugins", "module_utils", "load_client.py")
    assert class_text(SUPERVISOR, "Watchdog") == class_text(client, "Watchdog")


# ---- a rank that stalls (the launcher's watchdog, roles/launch/files/rank_watchdog.py)


def test_the_stall_words_are_the_controllers():
    """The supervisor stands alone on its node: its copy of the stall status and words is held to
    launch/exit_status.py's (and the bench's and the watchdog's, which writes them)."""
    from ansible_collections.prima.cluster.plugins.plugin_utils.launch import exit_status
    from ansible_collections.prima.cluster.plugins.plugin_utils.serve import supervision
    from test_launch import wd

    assert sv.STALL_EXIT == exit_status.STALL_EXIT == wd.STALL_EXIT == 119
    assert sv.STALL_WORDS == exit_status.STALL_WORDS == wd.STALL_WORDS
    # The supervisor's copy of the controller's table, word for word.
    assert sv.STATUS_WORDS == exit_status.STATUS_WORDS
    for status in list(exit_status.STATUS_WORDS) + [119, 2, 130, 200, 255]:
        assert sv.status_words(status) == exit_status.status_words(status, None, "launch_server_stall_s")
    line = '{"running": false, "pid": 12, "exit": 119, "ended": 1.5, "stalled": 120}'
    assert sv.watch_outcome(json.loads(line), 0, "ssh") == (
        119, "exited with status 119: stalled: no output and no traffic for 120 s")
    assert sv.status_stalled(json.loads(line)) == 120 and sv.status_stalled({"stalled": None}) is None
    assert supervision.exit_meaning(119, "prima", "worker", stalled_s=120) == \
        "exited 119: stalled: no output and no traffic for 120 s"
    judged = sv.judge_stop(rank(1), True, "", json.loads(line), [0, 143])
    assert not judged["clean"] and judged["note"] == "exited with status 119: stalled: no output and no traffic " \
                                                     "for 120 s"


HEARTBEAT_WORKER = r'''
import socket, sys, time
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", int(sys.argv[1])))
listener.listen()
print("worker ready on port %s" % sys.argv[1], file=sys.stderr, flush=True)
while True:
    print("tick", flush=True)
    time.sleep(0.5)
'''


def test_a_stalled_worker_is_a_failure_with_its_cause(ring, tmp_path):
    """SIGSTOP on a worker that was printing: its watchdog kills it after stall_s, rank.sh records 119 and the
    seconds, the supervisor's watch names the cause, and the ring is handled as for any dead rank."""
    up = ring(restarts=0, stall_s={1: 3})
    (tmp_path / "worker.py").write_text(HEARTBEAT_WORKER)
    up.start()
    up.wait_state(lambda s: s["state"] == "running")
    worker = up.program_pid(1)
    os.kill(worker, signal.SIGSTOP)
    stopped_at = time.monotonic()
    assert up.process.wait(timeout=20) == 1, up.log.read_text()
    assert time.monotonic() - stopped_at < 3 + 3 + 6  # stall_s, one poll, the supervisor's watch and stop
    state = up.state()
    failure = state["last_failure"]
    assert (state["state"], failure["rank"], failure["host"], failure["exit"], failure["stalled_s"]) == \
        ("failed", 1, "n1", 119, 3)
    assert failure["message"] == "rank 1 (worker on n1): exited with status 119: stalled: no output and no traffic " \
                                 "for 3 s"
    assert (up.state_dirs[1] / "stalled").read_text().startswith("3\nstalled: no output and no traffic for 3 s")
    from ansible_collections.prima.cluster.plugins.plugin_utils.serve import supervision

    assert supervision.failure_text(failure, "llama_rpc").startswith(
        "rank 1 on n1 (worker): exited 119: stalled: no output and no traffic for 3 s, at ")
    assert up.nothing_running() and gone(worker)
