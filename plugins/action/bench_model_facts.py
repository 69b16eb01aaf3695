"""Action plugin: each model's facts from the GGUF header of its weights on a node, in one task.

The gguf library is on the controller, not on the nodes: copy the first MiB of the weights
(dd, on the node), fetch them, read them with plugin_utils/models/gguf_header.py's header_facts, clean up.
A damaged or cut header fails the task in one line naming the model and its file on the node.
The documentation is in plugins/modules/bench_model_facts.py.
"""

import os
import shlex
import tempfile
from typing import Any, Dict, Mapping

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.prima.cluster.plugins.plugin_utils.models.gguf_header import HeaderCut, header_facts

ARGUMENT_SPEC = {
    "models": {"type": "dict", "required": True},
    "header_mib": {"type": "int", "default": 16},
    "remote_dir": {"type": "path", "required": True},
}
MODEL_KEYS = ("path", "size", "total")


def byte_count(value: Any) -> int:
    """A file size from the models argument (an int, or its digits after templating); -1 when it is not one.
    ASCII digits only, and under 20 of them: int() refuses other digits and very long runs of them."""
    text = str(value).strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) < 20 else -1


def read_header(name: str, model: Mapping[str, Any], local: str) -> Dict[str, Any]:
    """Model `name`'s facts from `local`, the fetched first bytes of its weights; every way the file
    can be bad is one AnsibleActionFail line naming the model and the file on the node."""
    try:
        return header_facts(local, byte_count(model["size"]), str(model["path"]))
    except HeaderCut as error:
        raise AnsibleActionFail("%s: %s (raise bench_header_mib)" % (name, error)) from None
    except (ValueError, OSError) as error:  # GGUFError: the file itself is bad; OSError: the local copy
        raise AnsibleActionFail("%s: %s" % (name, error)) from None


class ActionModule(ActionBase):
    TRANSFERS_FILES = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        if args["header_mib"] < 1:
            raise AnsibleActionFail("bench_model_facts: header_mib must be 1 or more, got %d" % args["header_mib"])
        for name, model in args["models"].items():
            if not isinstance(model, dict) or any(key not in model for key in MODEL_KEYS):
                raise AnsibleActionFail("bench_model_facts: models.%s must give %s (bench_model_files gives them)"
                                        % (name, ", ".join(MODEL_KEYS)))
            if byte_count(model["size"]) < 0 or byte_count(model["total"]) < 0:
                raise AnsibleActionFail("bench_model_facts: models.%s: size and total must be byte counts, got %r "
                                        "and %r" % (name, model["size"], model["total"]))
        facts = {}
        for name, model in sorted(args["models"].items()):
            remote = "%s/header-%s.gguf" % (args["remote_dir"].rstrip("/"), name)
            copy = self._low_level_execute_command(" ".join(shlex.quote(part) for part in (
                "dd", "if=%s" % model["path"], "of=%s" % remote, "bs=1M", "count=%d" % int(args["header_mib"]),
                "status=none")))
            if copy["rc"] != 0:
                raise AnsibleActionFail("%s: cannot read the header of %s: %s"
                                        % (name, model["path"], copy["stderr"].strip()))
            with tempfile.TemporaryDirectory(prefix="bench-header-") as local_dir:
                local = os.path.join(local_dir, "header.gguf")
                try:
                    self._connection.fetch_file(remote, local)
                finally:
                    self._low_level_execute_command("rm -f %s" % shlex.quote(remote))
                facts[name] = read_header(name, model, local)
            facts[name]["file_bytes"] = byte_count(model["total"])
        result.update(changed=False, ansible_facts={"bench_model_facts": facts})
        return result
