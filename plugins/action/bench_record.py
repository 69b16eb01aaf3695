"""Action plugin: judge one benchmark run from every rank's fetched logs, and set its figures as a fact.

Runs on the controller after the bench role fetched each rank's stdout/stderr into
reports/<run-id>/raw. The judging and parsing are pure functions in plugins/benchrun.py.
"""

import os
import sys
import tarfile

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# The pure modules live one level up, beside perflog.py (Ansible does not import plugin dirs as packages).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchrun import log_was_cut, rank_problems, run_record  # noqa: E402


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
    _VALID_ARGS = frozenset(("plan", "ranks", "raw_dir", "run_label", "meta", "tail_lines", "retries"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        plan, raw_dir, label = args["plan"], args["raw_dir"], args["run_label"]

        def log_dir(host):
            return os.path.join(raw_dir, host, plan["name"], label)

        for rank in args["ranks"]:
            unpack(log_dir(rank["host"]))
        ranks = [dict(rank, stderr=read_text(os.path.join(log_dir(rank["host"]), "stderr"))) for rank in args["ranks"]]
        problems = rank_problems(plan["runtime"], ranks, int(args.get("tail_lines", 15)))
        where = "raw logs kept in %s/<host>/%s/%s; results.jsonl untouched" % (raw_dir, plan["name"], label)
        if problems:
            raise AnsibleActionFail("%s failed:\n%s\n(%s)" % (plan["name"], "\n".join(problems), where))
        head = [rank for rank in ranks if rank["role"] == "head"][0]
        record = run_record(plan, ranks, head["stderr"], args.get("meta") or {})
        if not any(value is not None for value in record["perf"].values()):
            stderr = "%s/stderr" % log_dir(head["host"])
            attempt = int((args.get("meta") or {}).get("attempt") or 0)
            if log_was_cut(ranks, record) and attempt < int(args.get("retries") or 0):
                lost = {"unit": plan["name"], "run": label, "stderr": stderr}
                self._display.warning("%s %s: the head exited 0 but its log stops before the perf lines (%s): "
                                      "llama.cpp's logger thread lost its tail at exit; running it again"
                                      % (plan["name"], label, stderr))
                result.update(changed=False, ansible_facts={"bench_run_attempt": attempt + 1, "bench_run_lost": lost})
                return result
            raise AnsibleActionFail("%s: the head's stderr has no perf lines (%s); %s. If the head exited 0, its log "
                                    "was cut at exit every time it was tried (llama.cpp's logger thread loses what "
                                    "it has not written; bench_log_cut_retries tries again)"
                                    % (plan["name"], stderr, where))
        result.update(changed=False, bench_run_result=record,
                      ansible_facts={"bench_run_result": record, "bench_run_attempt": 0})
        return result
