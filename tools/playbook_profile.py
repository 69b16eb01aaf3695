"""Where a playbook's wall time goes, per task (summed over its hosts), on the sandbox.

    .venv/bin/python tools/playbook_profile.py bench.yml '{"model": "tiny", "runtime": "single", "runs": 1}'

Runs the playbook once through ansible-runner with the checkout's ansible.cfg and the mapped sandbox inventory
(reports into a temporary directory), then prints its status, its wall time and the 40 costliest tasks: the time
from each task's start to the next one's, from the runner's events.
"""

import collections
import datetime
import json
import os
import sys
import tempfile
import time

import ansible_runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    playbook = sys.argv[1]
    extravars = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    envvars = {"ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
               "PRIMA_BENCH_REPORTS_DIR": tempfile.mkdtemp(prefix="profile-reports-")}
    started = time.monotonic()
    runner = ansible_runner.run(private_data_dir=tempfile.mkdtemp(prefix="profile-runner-"), project_dir=REPO,
                                playbook=playbook, inventory=os.path.join(REPO, "inventory", "sandbox-mapped.yml"),
                                extravars=extravars, envvars=envvars, quiet=True)
    wall_s = time.monotonic() - started
    marks = [(datetime.datetime.fromisoformat(event["created"]),
              event["event_data"].get("task") or event["event_data"].get("play") or event["event"])
             for event in runner.events
             if event.get("event") in ("playbook_on_task_start", "playbook_on_play_start", "playbook_on_stats")]
    seconds = collections.Counter()  # type: collections.Counter
    for (at, name), (after, dummy) in zip(marks, marks[1:]):
        seconds[name] += (after - at).total_seconds()
    print("status %s, wall %.1f s" % (runner.status, wall_s))
    for name, spent in seconds.most_common(40):
        print("%6.1f  %s" % (spent, name))
    return 0 if runner.status == "successful" else 1


if __name__ == "__main__":
    sys.exit(main())
