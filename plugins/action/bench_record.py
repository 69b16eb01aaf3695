"""Action plugin: judge one benchmark run from every rank's fetched logs, and keep what it read beside them.

Runs on the controller after the bench role fetched each rank's stdout/stderr into
reports/<run-id>/raw. The judging and parsing are pure functions in plugin_utils/bench/run.py, the records on
disk are plugin_utils/bench/records.py's; the documentation is in plugins/modules/bench_record.py.
"""

import os
import tarfile

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.prima.cluster.plugins.plugin_utils.bench.records import LOST, RUN, keep_judged, write_json
from ansible_collections.prima.cluster.plugins.plugin_utils.bench.run import (PLAN_KEYS, log_was_cut, rank_problems,
                                                                              run_record)
from ansible_collections.prima.cluster.plugins.plugin_utils.transport.connections import drop_problems

ARGUMENT_SPEC = {
    "plan": {"type": "dict", "required": True},
    "ranks": {"type": "list", "elements": "dict", "required": True},
    "raw_dir": {"type": "path", "required": True},
    "run_label": {"type": "str", "required": True},
    "meta": {"type": "dict", "default": {}},
    "tail_lines": {"type": "int", "default": 15},
    "retries": {"type": "int", "default": 0},
}


def unpack(directory):
    """Each rank's run.tar (plain files by name, made by its launcher) unpacked beside it."""
    archive = os.path.join(directory, "run.tar")
    if not os.path.exists(archive):
        return
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if member.isfile() and "/" not in member.name and not member.name.startswith("."):
                with tar.extractfile(member) as source, open(os.path.join(directory, member.name), "wb") as target:
                    target.write(source.read())
    os.remove(archive)


def read_text(path):
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        plan, raw_dir, label = args["plan"], args["raw_dir"], args["run_label"]
        missing = [key for key in PLAN_KEYS if key not in plan]
        if missing:
            raise AnsibleActionFail("bench_record: plan lacks %s; pass a plan from the launch role's launch_plans"
                                    % ", ".join(missing))

        def log_dir(host):
            return os.path.join(raw_dir, host, plan["name"], label)

        for rank in args["ranks"]:
            unpack(log_dir(rank["host"]))
        ranks = [dict(rank, stderr=read_text(os.path.join(log_dir(rank["host"]), "stderr"))) for rank in args["ranks"]]
        problems = rank_problems(plan["runtime"], ranks, args["tail_lines"])
        drops = drop_problems(plan, args["meta"].get("transport_drops") or {})
        if problems:
            # A tunnel that dropped is the cause of what its ranks did next: named first.
            problems = drops + problems
        elif drops:
            self._display.warning("%s %s: the run succeeded although %s" % (plan["name"], label, "; ".join(drops)))
        where = "raw logs kept in %s/<host>/%s/%s; results.jsonl untouched" % (raw_dir, plan["name"], label)
        if problems:
            raise AnsibleActionFail("%s failed:\n%s\n(%s)" % (plan["name"], "\n".join(problems), where))
        head = [rank for rank in ranks if rank["role"] == "head"][0]
        record = run_record(plan, ranks, head["stderr"], args["meta"])
        if not any(value is not None for value in record["perf"].values()):
            stderr = "%s/stderr" % log_dir(head["host"])
            attempt = int(args["meta"].get("attempt") or 0)
            if log_was_cut(ranks, record) and attempt < args["retries"]:
                lost = {"unit": plan["name"], "run": label, "stderr": stderr}
                write_json(os.path.join(log_dir(head["host"]), LOST), lost)
                self._display.warning("%s %s: the head exited 0 but its log stops before the perf lines (%s): "
                                      "llama.cpp's logger thread lost its tail at exit; running it again"
                                      % (plan["name"], label, stderr))
                result.update(changed=False, run_dir=os.path.dirname(raw_dir), lost=lost,
                              ansible_facts={"bench_run_attempt": attempt + 1})
                return result
            raise AnsibleActionFail("%s: the head's stderr has no perf lines (%s); %s. If the head exited 0, its log "
                                    "was cut at exit every time it was tried (llama.cpp's logger thread loses what "
                                    "it has not written; bench_log_cut_retries tries again)"
                                    % (plan["name"], stderr, where))
        judged = keep_judged(raw_dir, log_dir(head["host"]), RUN, plan, args["meta"], args["ranks"], label)
        result.update(changed=True, run_dir=os.path.dirname(raw_dir), judged=judged, record=record,
                      ansible_facts={"bench_run_attempt": 0})
        return result
