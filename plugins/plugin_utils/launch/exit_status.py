"""What a rank's exit status says, in words: one table for bench.yml's judging, serve.yml's status and the serve
supervisor (pure, standard library).

The ranks run under timeout(1) inside their launcher (roles/launch/templates/rank.sh.j2): a signal shows as 128+N, and
the launcher's watchdog (roles/launch/files/rank_watchdog.py) stops a stalled rank with STALL_EXIT. The supervisor
runs on a node without the collection and keeps a copy of this table; tests/unit/test_serve_supervisor.py holds
the copies equal, as test_launch.py does the watchdog's.
"""

import signal
from typing import Optional

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


def status_words(status: int, stalled_s: Optional[int] = None, stall_setting: str = "launch_stall_s") -> str:
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
