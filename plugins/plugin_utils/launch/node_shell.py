"""Shell rendered into the node-side scripts of more than one role, defined here once."""

import re
import shlex


def basic_regex(text: str) -> str:
    """`text` matched literally by grep's basic regular expressions."""
    return re.sub(r"([.\[\]*^$\\])", r"\\\1", text)


def ranks_at_work_function(launch_dir: str, name: str = "ranks_at_work") -> str:
    """A bash function that succeeds while a rank (or its launcher) runs on this node: a launcher script of
    `launch_dir` in a process's argv. The link guard and the SSH forwarders both stand down while one does."""
    pattern = shlex.quote(basic_regex(launch_dir.rstrip("/")) + r"/[^/]*\.sh")
    return "\n".join([
        "%s() {" % name,
        "  # This node's only: where nodes share one machine's pids (chroots, as in the sandbox), another node's rank",
        "  # has another root.",
        "  local found",
        "  for found in $(grep -lszx -- %s /proc/[0-9]*/cmdline); do" % pattern,
        '    [ "${found%/cmdline}/root" -ef / ] && return 0',
        "  done",
        "  return 1",
        "}",
    ])
