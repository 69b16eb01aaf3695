"""Filters of the cluster_lock role; the logic is in plugin_utils/cluster/lock.py. These adapters add what only
the controller knows: its host name and machine identity, the ansible-playbook process id and start, the clock,
and whether a process runs."""

import datetime
import multiprocessing
import os
import random
import socket
from typing import Any, Dict, Mapping, Optional

from ansible.errors import AnsibleFilterError

from ansible_collections.prima.cluster.plugins.plugin_utils.cluster.lock import (
    bench_bound_s, format_record, judge, parse_answer, parse_record, process_state, same_process_space, stat_start)

MACHINE_ID = "/etc/machine-id"
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def controller_pid() -> int:
    """The ansible-playbook process: templating runs in a worker forked from it (its multiprocessing parent),
    or in that process itself."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None and parent.pid else os.getpid()


def _read(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return None


def process_identity(pid: int) -> Dict[str, Any]:
    """Where pid runs and since when, as the record keeps it: this machine's identity (/etc/machine-id, else the
    boot id: then a reboot makes another machine of it, which only costs waiting for the bound), the boot id
    (a start is counted per boot), the pid namespace, and the process's start. What cannot be read is "" (None
    for the start): a holder recorded so is never judged gone here."""
    boot = (_read(BOOT_ID) or "").strip()
    machine = (_read(MACHINE_ID) or "").strip()
    if not machine or machine == "uninitialized":
        machine = "boot:" + boot if boot else ""
    try:
        pid_ns = os.readlink("/proc/%d/ns/pid" % pid)
    except OSError:
        pid_ns = ""
    return {"machine": machine, "boot": boot, "pid_ns": pid_ns, "pid_start": stat_start(_read("/proc/%d/stat" % pid))}


def controller_process_state(pid: int, start: Optional[int] = None) -> str:
    """running or gone, for a pid on this controller (started at start, when known); without /proc (macOS),
    whether the pid exists."""
    if os.path.isdir("/proc/self"):
        return process_state(_read("/proc/%d/stat" % pid), _read("/proc/%d/cmdline" % pid), start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except OSError:
        pass
    return "running"


def record(run_id: Any, playbook: str, bound_s: Any) -> str:
    """This run's record; an empty run id gets one like bench.yml's (UTC time and 4 hex digits)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    run_id = str(run_id or "") or "%s-%04x" % (now.strftime("%Y%m%dT%H%M%SZ"), random.randrange(65536))
    try:
        pid = controller_pid()
        return format_record(run_id, playbook, socket.gethostname(), pid, now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                             int(bound_s), **process_identity(pid))
    except (TypeError, ValueError) as error:
        raise AnsibleFilterError("cluster_lock_record: %s (cluster_lock_bound_s must be a number of seconds)" % error)


def answer(stdout: str) -> Dict[str, Any]:
    try:
        found = parse_answer(stdout)
    except ValueError as error:
        raise AnsibleFilterError("cluster_lock: %s" % error)
    return {"outcome": found.outcome, "age_s": found.age_s, "held": found.held}


def verdict(stdout: str, mine: str, default_bound_s: Any, break_lock: Any, lock_host: str,
            lock_path: str) -> Dict[str, Any]:
    """taken, break or refuse (cluster/lock.py's judge), with whether the holder's process runs here when it ran in
    this same process space (machine, boot, pid namespace: never by host name)."""
    try:
        found = parse_answer(stdout)
        holder = parse_record(found.held)
        here = same_process_space(holder, process_identity(os.getpid())) and holder.get("pid") is not None
        state = controller_process_state(holder["pid"], holder.get("pid_start")) if here else None
        return judge(found, mine, state, int(default_bound_s), bool(break_lock), lock_host, lock_path)
    except ValueError as error:
        raise AnsibleFilterError("cluster_lock on %s (%s): %s" % (lock_host, lock_path, error))


def bench_bound(values: Mapping[str, Any]) -> int:
    """bench_bound_s from bench.yml's values, by name."""
    try:
        return bench_bound_s(**{key: int(value) for key, value in values.items()})
    except (TypeError, ValueError) as error:
        raise AnsibleFilterError("cluster_lock_bench_bound_s: %s" % error)


class FilterModule:
    def filters(self):
        return {
            "cluster_lock_record": record,
            "cluster_lock_answer": answer,
            "cluster_lock_verdict": verdict,
            "cluster_lock_bench_bound_s": bench_bound,
        }
