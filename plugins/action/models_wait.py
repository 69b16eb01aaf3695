"""Action: wait for an async weights download, printing its progress as it goes.

Long downloads (40 GB) would otherwise be one silent task for most of an hour. This polls
the job with async_status and, every `interval` seconds, reads the progress file the
download keeps and prints bytes, percent and rate for the host. Returns the job's result.
Documented in plugins/modules/models_wait.py.
"""

import base64
import json
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


def describe_progress(host: str, progress: dict) -> str:
    mib = 1024.0 * 1024.0
    done = progress.get("bytes") or 0
    total = progress.get("total")
    text = "%s: %s %s %.1f MiB" % (host, progress.get("file", "?"), progress.get("state", "?"), done / mib)
    if total:
        text += " of %.1f MiB (%.1f%%)" % (total / mib, 100.0 * done / total)
    text += " at %.1f MB/s after %ss" % ((progress.get("rate_bytes_s") or 0) / 1e6, progress.get("elapsed_s", 0))
    return text


class ActionModule(ActionBase):
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec={
            "jid": {"type": "str", "required": True},
            "progress_file": {"type": "str", "required": True},
            "interval": {"type": "int", "default": 30},
            "timeout": {"type": "int", "default": 86400},
        })
        async_dir = self._remote_expand_user(self.get_shell_option("async_dir", default="~/.ansible_async"))
        host = task_vars.get("inventory_hostname", "?") if task_vars else "?"
        started = time.monotonic()
        last_report = started
        while True:
            status = self._execute_module(module_name="ansible.legacy.async_status", task_vars=task_vars,
                                          module_args={"jid": args["jid"], "_async_dir": async_dir})
            if status.get("finished"):
                self._execute_module(module_name="ansible.legacy.async_status", task_vars=task_vars,
                                     module_args={"jid": args["jid"], "mode": "cleanup",
                                                  "_async_dir": async_dir})
                for key in ("ansible_job_id", "started", "finished", "results_file", "stdout", "stderr",
                            "stdout_lines", "stderr_lines"):
                    status.pop(key, None)
                result.update(status)
                return result
            if status.get("failed"):
                raise AnsibleActionFail("%s: lost track of the download job %s: %s"
                                        % (host, args["jid"], status.get("msg", status)))
            now = time.monotonic()
            if now - started > args["timeout"]:
                raise AnsibleActionFail("%s: the download did not finish within %ds" % (host, args["timeout"]))
            if now - last_report >= args["interval"]:
                last_report = now
                display.display(self._progress_line(host, args["progress_file"], task_vars))
            time.sleep(min(1.0, args["interval"]))

    def _progress_line(self, host: str, path: str, task_vars) -> str:
        answer = self._execute_module(module_name="ansible.legacy.slurp", task_vars=task_vars,
                                      module_args={"src": path})
        if answer.get("failed") or "content" not in answer:
            return "%s: download starting" % host
        try:
            progress = json.loads(base64.b64decode(answer["content"]).decode("utf-8"))
        except ValueError:
            return "%s: download running" % host
        return describe_progress(host, progress)
