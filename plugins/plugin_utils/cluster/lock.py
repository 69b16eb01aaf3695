"""The cluster lock: one bench.yml or site.yml at a time changes or benchmarks a cluster.

The lock is a symlink on rank 0's node whose target is the holder's record, one line of JSON: the
controller host, the ansible-playbook process id there, the run id, the playbook, its start time and
its bound (how long that run may take at most); and where that process ran: the controller's machine
identity (/etc/machine-id, else its boot id), its boot id, its pid namespace and the process's own start
(clock ticks after boot, /proc/<pid>/stat field 22). A symlink is made in one step with its content, so a
reader never sees a lock without its holder. The role cluster_lock takes it with a small script run
under flock(1) on that node (take, read, replace exactly the record judged breakable, release only
one's own record); this module formats and parses what the script says and judges a holder found there.

A holder is provably gone when it ran in this same process space (same machine identity, same boot, same
pid namespace: a host name is no identity, two controllers may share one) and no process with its pid and
its start runs there (no such pid, a zombie, or the pid now belongs to a process started at another time),
or when its lock is older than its own bound. Any other holder, a record of an earlier version without
these fields too, is refused unless the user breaks the lock. Pure functions.
"""

import dataclasses
import json
from typing import Any, Dict, Mapping, Optional

RECORD_KEYS = ("run_id", "playbook", "controller", "pid", "started", "bound_s", "machine", "boot", "pid_ns",
               "pid_start")
# Where the holder's pid means something: all three equal, or its process cannot be looked for from here.
SPACE_KEYS = ("machine", "boot", "pid_ns")
INT_KEYS = ("pid", "bound_s", "pid_start")
# /proc/<pid>/stat: field 22, starttime; counted from field 3, the first after the command name's ')'.
STAT_START_INDEX = 22 - 3


@dataclasses.dataclass(frozen=True)
class Answer:
    """What the lock script printed: its outcome, the age of the lock it found and that lock's record."""
    outcome: str
    age_s: Optional[int]
    held: str


def format_record(run_id: str, playbook: str, controller: str, pid: int, started: str, bound_s: int,
                  machine: str = "", boot: str = "", pid_ns: str = "", pid_start: Optional[int] = None) -> str:
    """The holder's record: one line of JSON in a fixed key order, readable with `readlink`. A part of the
    process's identity that is not known is left out (its holder can then only be refused or aged)."""
    values = {"run_id": str(run_id), "playbook": str(playbook), "controller": str(controller), "pid": int(pid),
              "started": str(started), "bound_s": int(bound_s), "machine": str(machine or ""),
              "boot": str(boot or ""), "pid_ns": str(pid_ns or ""),
              "pid_start": int(pid_start) if pid_start is not None else None}
    return json.dumps({key: values[key] for key in RECORD_KEYS if values[key] not in ("", None)},
                      separators=(", ", ": "))


def parse_record(text: str) -> Dict[str, Any]:
    """A record as a dict. A lock of an earlier version (the run id alone) or anything else unreadable
    gives {"run_id": <text>} and no controller: such a holder can only be refused or broken by age."""
    text = (text or "").strip()
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        return {"run_id": text or "unknown"}
    record = {}  # type: Dict[str, Any]
    for key in RECORD_KEYS:
        if key in value:
            record[key] = value[key]
    for key in INT_KEYS:
        if key in record:
            try:
                record[key] = int(record[key])
            except (TypeError, ValueError):
                del record[key]
    for key in SPACE_KEYS:
        if key in record and (not isinstance(record[key], str) or not record[key]):
            del record[key]
    return record


def same_process_space(holder: Mapping[str, Any], me: Mapping[str, Any]) -> bool:
    """Whether the holder's pid can be looked for here: same machine, same boot (a pid and its start are counted
    per boot) and same pid namespace (a container sharing the machine's identity has pids of its own). Unknown
    counts as different: a host name alone never makes a controller this one."""
    return all(isinstance(holder.get(key), str) and holder.get(key) and holder.get(key) == me.get(key)
               for key in SPACE_KEYS)


def stat_start(stat: Optional[str]) -> Optional[int]:
    """The process's start (clock ticks after boot) from the text of /proc/<pid>/stat; None when unreadable."""
    if stat is None:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[STAT_START_INDEX])
    except (IndexError, ValueError):
        return None


def parse_answer(stdout: str) -> Answer:
    """The lock script's three parts: outcome, age ("-" when no lock was found), the record found."""
    parts = (stdout or "").split("\n", 2)
    if len(parts) < 2 or not parts[0].strip():
        raise ValueError("the lock script printed %r, not its outcome and the lock's age" % (stdout or "")[:200])
    age = parts[1].strip()
    try:
        age_s = None if age in ("", "-") else max(0, int(age))
    except ValueError:
        raise ValueError("the lock script printed the age %r, not a number of seconds" % age)
    return Answer(outcome=parts[0].strip(), age_s=age_s, held=parts[2].rstrip("\n") if len(parts) > 2 else "")


def process_state(stat: Optional[str], cmdline: Optional[str], start: Optional[int] = None) -> str:
    """running or gone, from /proc/<pid>/stat and /proc/<pid>/cmdline (None: no such file, no such pid).
    A zombie is gone (killed, not yet reaped). With the holder's start known, a pid started at another time is
    another process (the pid was reused), and one started then is the holder, whatever it runs; without it, a
    pid that now runs anything but Ansible is taken for reused."""
    if stat is None:
        return "gone"
    state = stat.rsplit(")", 1)[-1].split()
    if state and state[0] in ("Z", "X"):
        return "gone"
    if start is not None:
        now = stat_start(stat)
        return "gone" if now is not None and now != start else "running"
    if cmdline is not None and cmdline.strip("\0 ") and "ansible" not in cmdline:
        return "gone"
    return "running"


def bench_bound_s(steps: int, plans: int, warmup_runs: int, runs: int, retries: int, listen_timeout_s: int,
                  run_timeout_s: int, stop_grace_s: int, overhead_s: int = 1800, run_overhead_s: int = 60) -> int:
    """The longest a bench.yml may take, from its own timeouts: every run of every unit on every link step,
    each tried (1 + retries) times, waits for its workers (listen timeout), runs the head to its timeout and
    stops every rank (twice the grace), plus per-run and fixed overheads (forwarders, probes, profile)."""
    attempts = max(1, int(steps)) * max(1, int(plans)) * (int(warmup_runs) + int(runs)) * (1 + int(retries))
    per_attempt = int(listen_timeout_s) + int(run_timeout_s) + 2 * int(stop_grace_s) + int(run_overhead_s)
    return int(overhead_s) + attempts * per_attempt


def describe_holder(holder: Mapping[str, Any], age_s: Optional[int]) -> str:
    """run X (bench.yml, controller C, pid P, started T, 12 s ago, bound 3600 s), as much as the record says."""
    details = []
    if holder.get("playbook"):
        details.append(str(holder["playbook"]))
    if holder.get("controller"):
        details.append("controller %s" % holder["controller"])
    if holder.get("pid") is not None:
        details.append("pid %s" % holder["pid"])
    if holder.get("started"):
        details.append("started %s" % holder["started"])
    if age_s is not None:
        details.append("%d s ago" % age_s)
    if holder.get("bound_s") is not None:
        details.append("bound %d s" % holder["bound_s"])
    if "controller" not in holder:
        details.append("a lock of an earlier version or not ours: no holder recorded")
    return "run %s (%s)" % (holder.get("run_id", "unknown"), ", ".join(details))


def judge(answer: Answer, mine: str, holder_process: Optional[str], default_bound_s: int, break_lock: bool,
          lock_host: str, lock_path: str) -> Dict[str, Any]:
    """What to do with the lock found by a take (or, in check mode, a read).

    mine: this run's record. holder_process: running or gone for the holder's pid when the holder ran in this
    process space (same_process_space, process_state), None otherwise; "gone" counts only then.
    Returns {action, reason, holder, message}; action is
    taken (this run holds it, or it is free in check mode), break (replace exactly answer.held) or refuse."""
    if answer.outcome in ("taken", "free") or (answer.outcome == "held" and answer.held == mine):
        return {"action": "taken", "reason": "", "holder": {}, "message": ""}
    if answer.outcome != "held":
        raise ValueError("unexpected outcome %r of the lock script on a take" % answer.outcome)
    holder = parse_record(answer.held)
    me = parse_record(mine)
    bound_s = holder.get("bound_s", int(default_bound_s))
    described = describe_holder(holder, answer.age_s)
    reason = ""
    if break_lock:
        reason = "break_lock=true"
    elif same_process_space(holder, me) and holder_process == "gone":
        reason = "its ansible-playbook (pid %s on %s) is not running any more" % (
            holder.get("pid"), holder.get("controller") or "this controller")
    elif answer.age_s is not None and answer.age_s > bound_s:
        reason = "it is %d s old, older than the %d s bound of its run" % (answer.age_s, bound_s)
    if reason:
        return {"action": "break", "reason": reason, "holder": holder,
                "message": "%s: broke the cluster lock %s held by %s: %s"
                           % (lock_host, lock_path, described, reason)}
    playbook = holder.get("playbook") or "bench.yml or site.yml"
    if same_process_space(holder, me):
        alive = "its ansible-playbook is still running here"
    elif holder.get("controller") and not all(holder.get(key) for key in SPACE_KEYS):
        alive = ("its record names controller %s but not which machine, boot and pid namespace (a lock of an earlier "
                 "version), so whether it still runs cannot be told from here" % holder["controller"])
    elif holder.get("controller") == me.get("controller"):
        alive = ("it ran on another controller (another machine, boot or container under the same host name %s), "
                 "so whether it still runs cannot be told from here" % holder["controller"])
    elif holder.get("controller"):
        alive = "it ran on another controller, so whether it still runs cannot be told from here"
    else:
        alive = "no holder is recorded, so whether it still runs cannot be told"
    message = ("another %s is running on this cluster: %s holds %s for %s; %s. Wait for it to end (it is broken "
               "by itself once older than its bound, %d s). If it is gone (killed on another controller), run "
               "again with -e break_lock=true, or remove the lock: ssh into %s and rm %s"
               % (playbook, lock_host, lock_path, described, alive, bound_s, lock_host, lock_path))
    return {"action": "refuse", "reason": alive, "holder": holder, "message": message}
