"""The shell function the link guard and the SSH forwarders share, run by bash against real processes."""

import subprocess
import time

from ansible_collections.prima.cluster.plugins.plugin_utils.launch.node_shell import ranks_at_work_function


def at_work(launch_dir):
    script = ranks_at_work_function(str(launch_dir)) + "\nranks_at_work\n"
    return subprocess.run(["bash", "-c", script], check=False, timeout=30).returncode == 0


def launcher(directory):
    script = directory / "rank-unit.sh"
    script.write_text("sleep 60\n")
    process = subprocess.Popen(["bash", str(script)])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until its argv is in /proc
        with open("/proc/%d/cmdline" % process.pid, "rb") as handle:
            if str(script).encode() in handle.read():
                break
        time.sleep(0.05)
    return process


def test_a_launcher_of_its_directory_is_at_work_and_only_that(tmp_path):
    # A dot in the directory is a literal dot, not grep's any-character: laXnch's launcher is not this one's.
    launch, lookalike = tmp_path / "la.nch", tmp_path / "laXnch"
    launch.mkdir()
    lookalike.mkdir()
    assert not at_work(launch)
    other = launcher(lookalike)
    try:
        assert not at_work(launch)
        assert at_work(lookalike)
        ours = launcher(launch)
        try:
            assert at_work(launch)
        finally:
            ours.kill()
            ours.wait()
    finally:
        other.kill()
        other.wait()
    assert not at_work(launch)


def test_a_directory_with_quotes_and_spaces_stays_one_word():
    text = ranks_at_work_function("/opt/it's here; rm -rf /")
    assert "grep -lszx -- '/opt/it'\"'\"'s here; rm -rf /" in text
