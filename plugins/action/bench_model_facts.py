"""Action plugin: each model's facts from the GGUF header of its weights on a node, in one task.

The gguf library is on the controller, not on the nodes: copy the first MiB of the weights
(dd, on the node), fetch them, read them with plugins/estimate.py's header_facts, clean up.
"""

import os
import shlex
import sys
import tempfile

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# The pure modules live one level up (Ansible does not import plugin dirs as packages).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from estimate import header_facts  # noqa: E402


class ActionModule(ActionBase):
    TRANSFERS_FILES = True
    _VALID_ARGS = frozenset(("models", "header_mib", "remote_dir"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        facts = {}
        for name, model in sorted(args["models"].items()):
            remote = "%s/header-%s.gguf" % (args["remote_dir"].rstrip("/"), name)
            copy = self._low_level_execute_command(" ".join(shlex.quote(part) for part in (
                "dd", "if=%s" % model["path"], "of=%s" % remote, "bs=1M", "count=%d" % int(args["header_mib"]),
                "status=none")))
            if copy["rc"] != 0:
                raise AnsibleActionFail("%s: cannot read the header of %s: %s" % (name, model["path"],
                                                                                 copy["stderr"].strip()))
            with tempfile.TemporaryDirectory(prefix="bench-header-") as local_dir:
                local = os.path.join(local_dir, "header.gguf")
                try:
                    self._connection.fetch_file(remote, local)
                finally:
                    self._low_level_execute_command("rm -f %s" % shlex.quote(remote))
                try:
                    facts[name] = header_facts(local, int(model["size"]))
                except ValueError as error:
                    raise AnsibleActionFail("%s (raise bench_header_mib)" % error)
            facts[name]["file_bytes"] = int(model["total"])
        result.update(changed=False, ansible_facts={"bench_model_facts": facts})
        return result
