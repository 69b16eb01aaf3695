#!/usr/bin/env python3
"""Keeps one serve unit's ring up: llama-server as rank 0 (the head), its workers on other nodes.

prima.cpp has no fault tolerance: once any rank of the ring dies the others hang or fail, so the whole ring is
stopped and started again, up to `restarts` times, with a pause that doubles each time. Runs on rank 0's node:

    python3 serve_supervisor.py run CONFIG.json      in the foreground, until SIGTERM/SIGINT or too many failures
    python3 serve_supervisor.py status CONFIG.json   the state file as one JSON line, plus "alive"
    python3 serve_supervisor.py start CONFIG.json    `run` detached (its own session, output to supervisor.log
                                                     beside the state file); returns once it wrote its state
    python3 serve_supervisor.py stop CONFIG.json     SIGTERM to it, wait until it is gone, then `status`
    python3 serve_supervisor.py free CONFIG.json     exit 0 when nothing listens on the server's port any more

Every rank is driven through the verbs of its launcher script (roles/launch/templates/rank.sh.j2), as the rank's
`control` argv plus the verb: the local script for the head, an ssh command for the peers, whose authorized_keys
line forces roles/serve/templates/peer.sh.j2. Python 3.8 and the standard library only: it runs on the nodes.
"""

import fcntl
import http.client
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

PROGRAM = "serve_supervisor.py"
HEAD_EXIT_139_NOTE = ("llama-server of prima.cpp exits 139 (SIGSEGV in its own cleanup) on every shutdown at the "
                      "pinned commit: a clean stop")
FAILURES_KEPT = 10
HEALTH_TRY_TIMEOUT_S = 2.0
HEALTH_POLL_S = 0.5
HEAD_STATUS_EVERY_S = 1.0
WATCH_POLL_S = 0.5
CONTROL_POLL_S = 0.1
PAUSE_STEP_S = 0.1
REQUIRED_KEYS = ("name", "state_file", "pid_file", "ranks", "health_url")
DEFAULTS = {"runtime": "", "model": "", "listen_timeout_s": 120, "load_timeout_s": 600, "restarts": 3,
            "backoff_s": 5, "backoff_max_s": 120, "clean_stop_exits": [0, 143], "stderr_tail_lines": 20,
            "control_timeout_s": 30, "stable_s": 600}
SECONDS_KEYS = ("listen_timeout_s", "load_timeout_s", "backoff_s", "backoff_max_s", "control_timeout_s", "stable_s")

Config = Dict[str, Any]
Rank = Dict[str, Any]
State = Dict[str, Any]
Failure = Dict[str, Any]


# ---- time and text


def iso_utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def utc_now() -> str:
    return iso_utc(time.time())


def log(message: str) -> None:
    print("%s %s" % (utc_now(), message), flush=True)


def last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


# A copy of the controller's plugin_utils/launch/exit_status.py (this program runs on a node without the collection);
# tests/unit/test_serve_supervisor.py holds the two equal. STALL_EXIT is rank.sh's status for a rank its
# watchdog stopped (launch_server_stall_s; roles/launch/files/rank_watchdog.py).
STALL_EXIT = 119
STALL_WORDS = "stalled: no output and no traffic for %s"
STATUS_WORDS = {
    0: "ok",
    1: "error",
    124: "hang: killed by its timeout",
    125: "timeout(1) itself failed",
    126: "not executable",
    127: "command not found",
    134: "abort (SIGABRT): an assert, or a lost RPC peer",
    137: "killed (SIGKILL), by kill -9 or the OOM killer",
    139: "segfault (SIGSEGV)",
    141: "broken pipe (SIGPIPE): its peer went away",
    143: "terminated (SIGTERM)",
}


def status_words(status: int, stalled_s: Optional[int] = None, stall_setting: str = "launch_server_stall_s") -> str:
    """The words for an exit status; a stall names its seconds (the rank's `stalled`), else the setting."""
    if status == STALL_EXIT:
        return STALL_WORDS % ("%d s" % stalled_s if stalled_s is not None else "its " + stall_setting)
    if status in STATUS_WORDS:
        return STATUS_WORDS[status]
    if 128 < status < 128 + 65:
        try:
            return "killed by %s" % signal.Signals(status - 128).name
        except ValueError:
            return "killed by signal %d" % (status - 128)
    return "error"


def exit_meaning(exit_code: int, stalled_s: Optional[int] = None) -> str:
    """': killed (SIGKILL)' for 137, after "exited with status 137" (the ranks run under timeout(1), which passes a
    signal's 128+N); for STALL_EXIT, the watchdog's words with its seconds (the `stalled` of the rank's status)."""
    return "" if exit_code == 0 else ": " + status_words(exit_code, stalled_s)


# ---- the config


def check_config(raw: Any) -> Config:
    """The config with defaults filled in; ValueError saying what is wrong (a bad config must not start a ring)."""
    if not isinstance(raw, dict):
        raise ValueError("the config is not a JSON object")
    missing = [key for key in REQUIRED_KEYS if key not in raw]
    if missing:
        raise ValueError("the config lacks %s" % ", ".join(missing))
    config = dict(DEFAULTS, **raw)
    ranks = config["ranks"]
    if not isinstance(ranks, list) or not ranks:
        raise ValueError("ranks: a non-empty list is needed")
    for key in ("name", "state_file", "pid_file", "health_url"):
        if not isinstance(config[key], str) or not config[key]:
            raise ValueError("%s: a non-empty string is needed, not %r" % (key, config[key]))
    if not config["health_url"].startswith("http://"):
        raise ValueError("health_url: an http:// URL is needed, not %r" % config["health_url"])
    if not isinstance(config["clean_stop_exits"], list) or not all(
            isinstance(code, int) and not isinstance(code, bool) for code in config["clean_stop_exits"]):
        raise ValueError("clean_stop_exits: a list of exit statuses is needed, not %r" % (config["clean_stop_exits"],))
    for rank in ranks:
        if not isinstance(rank, dict):
            raise ValueError("each rank is an object with rank, host, role and control, not %r" % (rank,))
        control = rank.get("control")
        if (not isinstance(rank.get("rank"), int) or not isinstance(control, list) or not control
                or not all(isinstance(word, str) for word in control)):
            raise ValueError("each rank needs an integer rank and a control argv (a list of strings): %r" % (rank,))
    numbers = sorted(rank["rank"] for rank in ranks)
    if numbers != list(range(len(ranks))):
        raise ValueError("ranks must be 0..%d, each once: %s" % (len(ranks) - 1, numbers))
    for key in SECONDS_KEYS:
        if isinstance(config[key], bool) or not isinstance(config[key], (int, float)) or config[key] < 0:
            raise ValueError("%s: a number of seconds >= 0 is needed, not %r" % (key, config[key]))
    for key in ("restarts", "stderr_tail_lines"):
        if isinstance(config[key], bool) or not isinstance(config[key], int) or config[key] < 0:
            raise ValueError("%s: an integer >= 0 is needed, not %r" % (key, config[key]))
    return config


def load_config(path: str) -> Config:
    with open(path) as handle:
        return check_config(json.load(handle))


# ---- the ring's order


def rank_role(rank: Rank) -> str:
    return rank.get("role") or ("head" if rank["rank"] == 0 else "worker")


def describe_rank(rank: Rank) -> str:
    return "rank %d (%s on %s)" % (rank["rank"], rank_role(rank), rank.get("host") or "?")


def head_of(ranks: Sequence[Rank]) -> Rank:
    return next(rank for rank in ranks if rank["rank"] == 0)


def workers_start_order(ranks: Sequence[Rank]) -> List[Rank]:
    """Highest rank first: each worker's next in the ring is up before it (rank 0, the head, comes last)."""
    return sorted((rank for rank in ranks if rank["rank"] > 0), key=lambda rank: rank["rank"], reverse=True)


def stop_order(ranks: Sequence[Rank]) -> List[Rank]:
    """The head first: it stops serving requests before the ring under it goes away."""
    return sorted(ranks, key=lambda rank: rank["rank"])


def backoff_delay(restarts: int, base: float, cap: float) -> float:
    """The pause before restart number `restarts` (1 for the first): base, doubled each time, at most cap."""
    if restarts < 1:
        return 0.0
    return float(min(cap, base * 2 ** min(restarts - 1, 62)))


# ---- what the ranks answer


def parse_status(text: str) -> Optional[Dict[str, Any]]:
    """The status JSON line of rank.sh (`status`, `wait`), the last one in text; None when there is none."""
    for line in reversed((text or "").splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and "running" in value:
            return value
    return None


def status_exit(status: Optional[Dict[str, Any]]) -> Optional[int]:
    value = (status or {}).get("exit")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def status_stalled(status: Optional[Dict[str, Any]]) -> Optional[int]:
    """The seconds of silence after which the rank's watchdog stopped it; None when it did not."""
    value = (status or {}).get("stalled")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def watch_outcome(status: Optional[Dict[str, Any]], returncode: Optional[int],
                  program: str) -> Tuple[Optional[int], str]:
    """(exit, what happened) when a rank's `wait` ended: no status line means the control itself failed."""
    if status is None:
        return None, "lost contact: %s exited %s" % (program, returncode)
    exit_code = status_exit(status)
    if exit_code is None:
        return None, "stopped running, with no exit status recorded"
    return exit_code, "exited with status %d%s" % (exit_code, exit_meaning(exit_code, status_stalled(status)))


def health_ok(code: Optional[int], body: str) -> bool:
    """llama-server answers 503 while it loads the model, then 200 with {"status": "ok"}."""
    if code != 200:
        return False
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the decoder goes
        return False
    return isinstance(answer, dict) and answer.get("status") == "ok"


class ControlResult(NamedTuple):
    returncode: Optional[int]  # None when it timed out, was interrupted or could not be run
    stdout: str
    stderr: str
    timed_out: bool = False
    interrupted: bool = False
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def control_problem(verb: str, result: ControlResult, timeout_s: Optional[float], program: str) -> str:
    if result.error:
        return "`%s` could not be run: %s" % (verb, result.error)
    if result.timed_out:
        return "`%s` timed out after %g s" % (verb, timeout_s or 0)
    if result.interrupted:
        return "`%s` was interrupted by a stop" % verb
    if program == "ssh" and result.returncode == 255:
        return "lost contact: ssh exited 255 (`%s`): %s" % (verb, last_line(result.stderr) or "no message")
    detail = last_line(result.stderr) or last_line(result.stdout)
    return "`%s` exited %s%s" % (verb, result.returncode, ": " + detail if detail else "")


def failure_record(rank: Rank, exit_code: Optional[int], what: str, stderr_tail: Sequence[str], at: str,
                   generation: int, phase: str, stalled_s: Optional[int] = None) -> Failure:
    return {"rank": rank["rank"], "host": rank.get("host", ""), "role": rank_role(rank), "exit": exit_code,
            "stderr_tail": list(stderr_tail), "at": at, "generation": generation, "phase": phase,
            "message": "%s: %s" % (describe_rank(rank), what), "stalled_s": stalled_s}


def judge_stop(rank: Rank, ran: bool, stop_problem: str, status: Optional[Dict[str, Any]],
               clean_exits: Sequence[int]) -> Dict[str, Any]:
    """How one rank ended when the supervisor was told to stop: {rank, host, exit, clean, note}."""
    entry = {"rank": rank["rank"], "host": rank.get("host", ""), "exit": None, "clean": False, "note": ""}
    if stop_problem:
        entry["note"] = "could not be stopped: " + stop_problem
        return entry
    if not ran:  # a leftover exit file is an older run's, not this stop's
        entry.update(clean=True, note="was not running")
        return entry
    exit_code = status_exit(status)
    entry["exit"] = exit_code
    if status is None:
        entry["note"] = "no status after the stop"
    elif exit_code is None:
        entry["note"] = "no exit status recorded (killed with its launcher?)"
    elif exit_code in clean_exits:
        entry["clean"] = True
        if exit_code == 139 and rank_role(rank) == "head":
            entry["note"] = HEAD_EXIT_139_NOTE
    else:
        entry["note"] = "exited with status %d%s" % (exit_code, exit_meaning(exit_code, status_stalled(status)))
    return entry


def stop_summary(entries: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    return {"clean": all(entry["clean"] for entry in entries), "ranks": list(entries)}


# ---- the state and its transitions (each returns a new state)


def initial_state(config: Config, pid: int, now: str) -> State:
    return {"name": config["name"], "runtime": config.get("runtime", ""), "model": config.get("model", ""),
            "state": "starting", "pid": pid, "supervisor_started": now, "generation": 0, "since": None,
            "restarts": 0, "max_restarts": config["restarts"], "next_start": None, "last_failure": None,
            "failures": [], "stop": None, "health_url": config["health_url"], "updated": now}


def changed(old: State, now: str, **changes: Any) -> State:
    new = dict(old, **changes)
    new["updated"] = now
    return new


def generation_started(state: State, now: str) -> State:
    return changed(state, now, state="starting", generation=state["generation"] + 1, since=None, next_start=None)


def ring_running(state: State, now: str) -> State:
    return changed(state, now, state="running", since=now)


def failure_recorded(state: State, failure: Failure, base_s: float, cap_s: float, now_epoch: float,
                     ran_s: float = 0.0, stable_s: float = math.inf) -> State:
    """One more restart, or "failed" past max_restarts; next_start tells when the next generation begins.
    A ring that served for stable_s before it failed starts over with every restart (and the first backoff):
    one crash a week must not add up to a failed server in a month."""
    if ran_s >= stable_s:
        state = changed(state, state["updated"], restarts=0)
    restarts = state["restarts"] + 1
    failures = (list(state["failures"]) + [failure])[-FAILURES_KEPT:]
    now = iso_utc(now_epoch)
    if restarts > state["max_restarts"]:
        # `restarts` counts the restarts made: the failure past the last one starts nothing.
        return changed(state, now, state="failed", since=None, next_start=None, restarts=state["restarts"],
                       last_failure=failure, failures=failures)
    next_start = iso_utc(now_epoch + backoff_delay(restarts, base_s, cap_s))
    return changed(state, now, state="restarting", since=None, next_start=next_start, restarts=restarts,
                   last_failure=failure, failures=failures)


def stopping(state: State, now: str) -> State:
    return changed(state, now, state="stopping", since=None, next_start=None)


def stopped(state: State, summary: Dict[str, Any], now: str) -> State:
    return changed(state, now, state="stopped", since=None, next_start=None, stop=summary)


# ---- files


def atomic_write(path: str, text: str) -> None:
    """A reader (`status`, Ansible) sees the old file or the new one, never half of one."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=directory, prefix=".%s." % os.path.basename(path))
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
            out.flush()
            os.fchmod(out.fileno(), 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_pid(path: str) -> Optional[int]:
    try:
        with open(path) as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def supervisor_alive(pid: Optional[int], config_path: str) -> bool:
    """Pid `pid` runs this program for this unit: a pid file outlives its process, and pids are reused, by
    another unit's supervisor too (which a stop would then SIGTERM). A word of its argv is this file (a substring
    would take test_serve_supervisor.py or an editor for it), and a later word is this unit's config."""
    if not pid:
        return False
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            words = handle.read().split(b"\0")
    except OSError:
        return False
    programs = [index for index, word in enumerate(words) if os.path.basename(word) == PROGRAM.encode()]
    if not programs:
        return False
    try:
        # A relative config word is relative to that process's directory, not ours.
        cwd = os.readlink("/proc/%d/cwd" % pid)
    except OSError:
        cwd = ""
    ours = os.path.realpath(config_path)
    return any(os.path.realpath(os.path.join(cwd, os.fsdecode(word))) == ours
               for word in words[programs[0] + 1:] if word and (cwd or word.startswith(b"/")))


# The lock on <pid file>.lock, held as long as this supervisor lives: checking the pid file and then writing it
# would let two supervisors started at once both run (each stopping the other's ranks).
_HELD_LOCKS = []  # type: List[int]


def claim_pid_file(path: str, pid: int) -> str:
    """Takes the unit's lock and writes our pid; the reason to refuse instead, when another supervisor holds it."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    descriptor = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        other = read_pid(path)
        return "another supervisor runs for this unit: pid %s (%s)" % (other if other else "unknown", path)
    _HELD_LOCKS.append(descriptor)
    atomic_write(path, "%d\n" % pid)
    return ""


def release_pid_file(path: str, pid: int) -> None:
    if read_pid(path) == pid:
        try:
            os.unlink(path)
        except OSError:
            pass


def read_state(path: str) -> Tuple[Optional[State], str]:
    try:
        with open(path) as handle:
            state = json.load(handle)
    except OSError as error:
        return None, "no state file: %s" % error
    except ValueError as error:
        return None, "the state file is not JSON: %s" % error
    if not isinstance(state, dict):
        return None, "the state file is not a JSON object"
    return state, ""


# ---- processes


def kill_group(process: "subprocess.Popen[str]") -> None:
    """Each control call leads its own process group, so this takes its children (a `sleep` of rank.sh) too."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def collect_output(process: "subprocess.Popen[str]") -> Tuple[str, str]:
    try:
        stdout, stderr = process.communicate(timeout=5)
    except (subprocess.TimeoutExpired, ValueError):  # a grandchild holds the pipe; what was read is enough
        return "", ""
    return stdout or "", stderr or ""


def spawn(argv: Sequence[str]) -> "subprocess.Popen[str]":
    return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, errors="replace", start_new_session=True)


def run_control(argv: Sequence[str], timeout_s: Optional[float], should_abort: Callable[[], bool]) -> ControlResult:
    try:
        process = spawn(argv)
    except OSError as error:
        return ControlResult(None, "", "", error=str(error))
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        try:
            stdout, stderr = process.communicate(timeout=CONTROL_POLL_S)
            return ControlResult(process.returncode, stdout or "", stderr or "")
        except subprocess.TimeoutExpired:
            pass
        timed_out = deadline is not None and time.monotonic() >= deadline
        if timed_out or should_abort():
            kill_group(process)
            stdout, stderr = collect_output(process)
            return ControlResult(None, stdout, stderr, timed_out=timed_out, interrupted=not timed_out)


class Watchdog:
    """Shuts a socket down at a deadline. A socket timeout bounds each read, not the answer: a server that
    trickles a byte within each would hold a request for as long as it likes, in the headers too (http.client
    reads them line by line). Shutdown, unlike close, also ends a read under way in another thread."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self.fired = threading.Event()
        self._timer = threading.Timer(max(0.0, seconds), self._shut, [sock])
        self._timer.daemon = True
        self._timer.start()

    def _shut(self, sock: socket.socket) -> None:
        self.fired.set()
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # closed already: the answer came first

    def stop(self) -> bool:
        """Whether it cut the answer. Joined, so that it cannot shut the socket down as it is being closed."""
        self._timer.cancel()
        self._timer.join()
        return self.fired.is_set()


def probe_health(url: str, timeout_s: float, limit: int = 65536) -> Tuple[Optional[int], str]:
    """One GET of `url` within `timeout_s` all told (connecting, headers, body): a trickling server cannot keep
    the supervisor from its signals and its ring. http.client asks no proxy (a node's http_proxy must not carry a
    request for 127.0.0.1 away) and follows no redirect (/health answers itself: a redirect is an answer)."""
    started = time.monotonic()
    watchdog = None  # type: Optional[Watchdog]
    connection = None  # type: Optional[http.client.HTTPConnection]
    try:
        parts = urllib.parse.urlsplit(url)
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=timeout_s)
        connection.connect()
        watchdog = Watchdog(connection.sock, started + timeout_s - time.monotonic())
        connection.request("GET", (parts.path or "/") + ("?" + parts.query if parts.query else ""))
        response = connection.getresponse()
        answer = (response.status, response.read(limit).decode("utf-8", "replace"))  # type: Tuple[Optional[int], str]
    except (OSError, http.client.HTTPException, ValueError) as error:
        answer = (None, str(error))
    finally:
        cut = watchdog is not None and watchdog.stop()
        if connection is not None:
            connection.close()
    return (None, "no complete answer within %g s" % timeout_s) if cut else answer


class StopRequested(Exception):
    """SIGTERM or SIGINT arrived: whatever the supervisor was doing gives way to stopping the ring."""


class Supervisor:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.ranks = sorted(config["ranks"], key=lambda rank: rank["rank"])
        self.stop_requested = False
        self.watchers = {}  # type: Dict[int, subprocess.Popen[str]]
        self.ran = set()  # type: Set[int]  # ranks started since the ring was last stopped
        self.phase = "starting"
        self.state = initial_state(config, os.getpid(), utc_now())

    def request_stop(self, signum: int, frame: Any) -> None:
        self.stop_requested = True  # no logging here: a print inside a print would raise

    def check_stop(self) -> None:
        if self.stop_requested:
            raise StopRequested()

    def save(self, state: State) -> None:
        self.state = state
        atomic_write(self.config["state_file"], json.dumps(state, indent=1, sort_keys=True) + "\n")

    def say(self, message: str) -> None:
        log("%s: %s" % (self.config["name"], message))

    # -- one control verb of one rank

    def timeout_for(self, verb: str) -> Optional[float]:
        if verb == "listening":
            return self.config["listen_timeout_s"] + self.config["control_timeout_s"]
        return self.config["control_timeout_s"]

    def control(self, rank: Rank, verb: str, *args: str, interruptible: bool = True) -> ControlResult:
        result = run_control(list(rank["control"]) + [verb] + list(args), self.timeout_for(verb),
                             lambda: interruptible and self.stop_requested)
        if result.interrupted:
            raise StopRequested()
        return result

    def problem(self, rank: Rank, verb: str, result: ControlResult) -> str:
        return control_problem(verb, result, self.timeout_for(verb), os.path.basename(rank["control"][0]))

    def stderr_tail(self, rank: Rank) -> List[str]:
        result = self.control(rank, "tail", str(self.config["stderr_tail_lines"]))
        return result.stdout.splitlines() if result.ok else []

    def failure(self, rank: Rank, what: str, exit_code: Optional[int] = None, ask_exit: bool = False,
                stalled_s: Optional[int] = None) -> Failure:
        if ask_exit:
            status = parse_status(self.control(rank, "status").stdout)
            exit_code, stalled_s = status_exit(status), status_stalled(status)
        record = failure_record(rank, exit_code, what, self.stderr_tail(rank), utc_now(), self.state["generation"],
                                self.phase, stalled_s)
        self.say("failure: %s" % record["message"])
        return record

    # -- watching

    def watch(self, rank: Rank) -> None:
        self.watchers[rank["rank"]] = spawn(list(rank["control"]) + ["wait"])

    def ended_watch(self) -> Optional[Failure]:
        for number, process in sorted(self.watchers.items()):
            if process.poll() is None:
                continue
            del self.watchers[number]
            stdout, dummy = collect_output(process)
            rank = self.ranks[number]
            status = parse_status(stdout)
            exit_code, what = watch_outcome(status, process.returncode, os.path.basename(rank["control"][0]))
            return self.failure(rank, what, exit_code, stalled_s=status_stalled(status))
        return None

    def kill_watchers(self) -> None:
        for process in self.watchers.values():
            kill_group(process)
            collect_output(process)
        self.watchers.clear()

    # -- one generation of the ring

    def start_rank(self, rank: Rank) -> Optional[Failure]:
        result = self.control(rank, "start")
        if not result.ok:
            return self.failure(rank, self.problem(rank, "start", result), ask_exit=True)
        self.ran.add(rank["rank"])
        self.say("started %s" % describe_rank(rank))
        return None

    def await_listening(self, rank: Rank) -> Optional[Failure]:
        result = self.control(rank, "listening", str(int(math.ceil(self.config["listen_timeout_s"]))))
        if not result.ok:
            return self.failure(rank, self.problem(rank, "listening", result), ask_exit=True)
        self.say("%s listens" % describe_rank(rank))
        return None

    def head_exited(self, head: Rank) -> Optional[Failure]:
        result = self.control(head, "status")
        status = parse_status(result.stdout)
        if not result.ok or status is None:
            return self.failure(head, self.problem(head, "status", result))
        if status.get("running"):
            return None
        exit_code = status_exit(status)
        return self.failure(head, "exited with status %s%s while loading the model" % (
            exit_code, exit_meaning(exit_code, status_stalled(status)) if exit_code is not None else ""), exit_code,
            stalled_s=status_stalled(status))

    def await_health(self, head: Rank) -> Optional[Failure]:
        started = time.monotonic()
        next_status = started + HEAD_STATUS_EVERY_S
        last_answer = "no answer"
        while True:
            self.check_stop()
            code, body = probe_health(self.config["health_url"], HEALTH_TRY_TIMEOUT_S)
            if health_ok(code, body):
                self.say("healthy after %.1f s" % (time.monotonic() - started))
                return None
            last_answer = "HTTP %s %s" % (code, last_line(body)[:200]) if code else last_line(body)
            failure = self.ended_watch()
            if failure:
                return failure
            if time.monotonic() >= next_status:
                next_status += HEAD_STATUS_EVERY_S
                failure = self.head_exited(head)
                if failure:
                    return failure
            if time.monotonic() - started >= self.config["load_timeout_s"]:
                return self.failure(head, "not healthy after %g s (last answer: %s)" % (
                    self.config["load_timeout_s"], last_answer), ask_exit=True)
            time.sleep(HEALTH_POLL_S)

    def generation(self) -> Failure:
        """Starts the ring and watches it: returns its first failure (or raises StopRequested)."""
        self.phase = "starting"
        self.save(generation_started(self.state, utc_now()))
        self.say("generation %d: starting" % self.state["generation"])
        for rank in stop_order(self.ranks):  # leftovers of a crashed supervisor or of a hand-made start
            result = self.control(rank, "stop")
            if not result.ok:
                self.say("stopping leftovers of %s: %s; going on"
                         % (describe_rank(rank), self.problem(rank, "stop", result)))
        workers = workers_start_order(self.ranks)
        for rank in workers:
            self.check_stop()
            failure = self.start_rank(rank)
            if failure:
                return failure
        for rank in workers:
            self.check_stop()
            failure = self.await_listening(rank)
            if failure:
                return failure
            self.watch(rank)
        head = head_of(self.ranks)
        self.check_stop()
        failure = self.start_rank(head)
        if failure:
            return failure
        self.watch(head)
        failure = self.await_health(head)
        if failure:
            return failure
        self.phase = "running"
        self.running_since = time.monotonic()
        self.save(ring_running(self.state, utc_now()))
        self.say("generation %d: running" % self.state["generation"])
        while True:
            self.check_stop()
            failure = self.ended_watch()
            if failure:
                return failure
            time.sleep(WATCH_POLL_S)

    def stop_ring(self) -> None:
        """After a failure: every rank down before the next generation (a half ring would hang on the old one)."""
        self.kill_watchers()
        for rank in stop_order(self.ranks):
            result = self.control(rank, "stop", interruptible=False)
            if not result.ok:
                self.say("stopping %s: %s" % (describe_rank(rank), self.problem(rank, "stop", result)))
        self.ran.clear()

    def pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.check_stop()
            time.sleep(min(PAUSE_STEP_S, max(0.0, deadline - time.monotonic())))

    def run(self) -> int:
        self.save(self.state)
        self.say("supervisor pid %d for %d ranks" % (os.getpid(), len(self.ranks)))
        try:
            while True:
                self.running_since = None  # type: Optional[float]
                failure = self.generation()
                ran_s = time.monotonic() - self.running_since if self.running_since is not None else 0.0
                self.stop_ring()
                self.save(failure_recorded(self.state, failure, self.config["backoff_s"],
                                           self.config["backoff_max_s"], time.time(), ran_s,
                                           self.config["stable_s"]))
                if self.state["state"] == "failed":
                    self.say("failed: %d restarts used up; last: %s" % (self.config["restarts"], failure["message"]))
                    return 1
                delay = backoff_delay(self.state["restarts"], self.config["backoff_s"], self.config["backoff_max_s"])
                self.say("restarting (%d of %d) in %g s" % (self.state["restarts"], self.config["restarts"], delay))
                self.pause(delay)
        except StopRequested:
            self.say("stop requested")
        return self.shutdown()

    def shutdown(self) -> int:
        self.save(stopping(self.state, utc_now()))
        self.kill_watchers()
        entries = []
        for rank in stop_order(self.ranks):
            result = self.control(rank, "stop", interruptible=False)
            stop_problem = "" if result.ok else self.problem(rank, "stop", result)
            status = None
            if not stop_problem:
                status = parse_status(self.control(rank, "status", interruptible=False).stdout)
            entry = judge_stop(rank, rank["rank"] in self.ran, stop_problem, status, self.config["clean_stop_exits"])
            entries.append(entry)
            self.say("stopped %s: exit %s%s" % (describe_rank(rank), entry["exit"],
                                                ", " + entry["note"] if entry["note"] else ""))
        self.ran.clear()
        summary = stop_summary(entries)
        self.save(stopped(self.state, summary, utc_now()))
        self.say("stopped, %s" % ("clean" if summary["clean"] else "not clean"))
        return 1 if any(entry["note"].startswith("could not be stopped") for entry in entries) else 0


# ---- commands


def status_command(config_path: str, config: Config) -> int:
    state, error = read_state(config["state_file"])
    report = dict(state) if state else {"name": config["name"], "state": "unknown", "error": error}
    pid = report.get("pid") if isinstance(report.get("pid"), int) else read_pid(config["pid_file"])
    report["alive"] = supervisor_alive(pid, config_path)
    print(json.dumps(report, sort_keys=True))
    return 0


def run_command(config_path: str, config: Config) -> int:
    refusal = claim_pid_file(config["pid_file"], os.getpid())
    if refusal:
        print("%s: %s" % (PROGRAM, refusal), file=sys.stderr)
        return 2
    supervisor = Supervisor(config)
    signal.signal(signal.SIGTERM, supervisor.request_stop)
    signal.signal(signal.SIGINT, supervisor.request_stop)
    try:
        return supervisor.run()
    except Exception:  # an unsupervised ring would hang on its first failure: take it down with us
        log("%s: crashed:\n%s" % (config["name"], traceback.format_exc()))
        try:
            supervisor.shutdown()
        except Exception:
            log("%s: stopping the ring after the crash failed:\n%s" % (config["name"], traceback.format_exc()))
        return 1
    finally:
        release_pid_file(config["pid_file"], os.getpid())


def start_command(config_path: str, config: Config, wait_s: float = 30.0) -> int:
    """`run` in a session of its own, detached from the caller's pipes (Ansible's command module waits for them
    to close), logging beside its state file. Returns once the new supervisor wrote its first state."""
    other = read_pid(config["pid_file"])
    if supervisor_alive(other, config_path):
        print("%s: another supervisor runs for this unit: pid %d (%s)" % (PROGRAM, other, config["pid_file"]),
              file=sys.stderr)
        return 2
    log_path = os.path.join(os.path.dirname(os.path.abspath(config["state_file"])), "supervisor.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "ab") as log_file, open(os.devnull, "rb") as nothing:
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "run", os.path.abspath(config_path)],
                                 stdin=nothing, stdout=log_file, stderr=log_file, start_new_session=True,
                                 close_fds=True, cwd="/")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        state, dummy = read_state(config["state_file"])
        if state and state.get("pid") == child.pid:
            print(json.dumps({"started": child.pid, "log": log_path}))
            return 0
        if child.poll() is not None:
            print("%s: the supervisor exited %s at once; its log %s says: %s" % (
                PROGRAM, child.returncode, log_path, last_lines(log_path, 5)), file=sys.stderr)
            return 1
        time.sleep(PAUSE_STEP_S)
    print("%s: the supervisor (pid %d) wrote no state in %g s; its log: %s" % (PROGRAM, child.pid, wait_s, log_path),
          file=sys.stderr)
    return 1


def last_lines(path: str, count: int) -> str:
    try:
        with open(path, errors="replace") as handle:
            return " | ".join(line.rstrip("\n") for line in handle.readlines()[-count:])
    except OSError as error:
        return str(error)


def stop_command(config_path: str, config: Config) -> int:
    """SIGTERM to the unit's supervisor, which stops its ring (head first); waits until it is gone. Exit 0 when
    every rank stopped cleanly or none ran, 1 otherwise; the state as `status` prints it."""
    pid = read_pid(config["pid_file"])
    if supervisor_alive(pid, config_path):
        os.kill(pid, signal.SIGTERM)
        # Each rank may take its stop grace and the control timeout; the head is stopped first, then each worker.
        deadline = time.monotonic() + float(config["control_timeout_s"]) * (len(config["ranks"]) + 1) + 30
        while supervisor_alive(pid, config_path) and time.monotonic() < deadline:
            time.sleep(PAUSE_STEP_S)
        if supervisor_alive(pid, config_path):
            print("%s: the supervisor (pid %d) did not stop in time" % (PROGRAM, pid), file=sys.stderr)
            return 1
        status_command(config_path, config)
        state, dummy = read_state(config["state_file"])
        return 0 if state and (state.get("stop") or {}).get("clean", False) else 1
    status_command(config_path, config)
    return 0


def port_listening(port: int, tables: Sequence[str] = ("/proc/net/tcp", "/proc/net/tcp6")) -> bool:
    """Anything of this node listens on `port`, on any address (the kernel's own tables: state 0A is LISTEN)."""
    suffix = ":%04X" % port
    for table in tables:
        try:
            with open(table) as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 3 and fields[3] == "0A" and fields[1].endswith(suffix):
                return True
    return False


def server_port(health_url: str) -> int:
    parsed = urllib.parse.urlsplit(health_url)
    return parsed.port or 80


def free_command(config_path: str, config: Config) -> int:
    """Exit 0 when nothing listens on the server's port any more (after a stop), 1 naming it otherwise."""
    port = server_port(config["health_url"])
    if port_listening(port):
        print("%s: port %d is still listened on after the stop (ss -tlnp 'sport = :%d' names the process)"
              % (config["name"], port, port), file=sys.stderr)
        return 1
    print(json.dumps({"name": config["name"], "port": port, "free": True}))
    return 0


COMMANDS = {"run": run_command, "status": status_command, "start": start_command, "stop": stop_command,
            "free": free_command}


def main(argv: Sequence[str]) -> int:
    if len(argv) != 3 or argv[1] not in COMMANDS:
        print("usage: %s run|start|stop|status|free CONFIG.json" % PROGRAM, file=sys.stderr)
        return 2
    try:
        config = load_config(argv[2])
    except (OSError, ValueError) as error:
        if argv[1] == "status":  # status always answers one JSON line, as Ansible reads it
            print(json.dumps({"state": "unknown", "alive": False, "error": "config %s: %s" % (argv[2], error)}))
        else:
            print("%s: config %s: %s" % (PROGRAM, argv[2], error), file=sys.stderr)
        return 2
    return COMMANDS[argv[1]](argv[2], config)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
