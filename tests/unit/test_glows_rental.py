"""playbooks/glows-rent.yml and glows-release.yml against the fake Glows API (no nodes, loopback only):
idempotent rent, exact release, a failed rent cleaning up after itself, rate limits, and refusals."""

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.prima.cluster.tests.fakes.glows_api import post_faults, serving

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
TOKEN = "tok-rent"
GPU = "NVIDIA GeForce RTX 4090"


@pytest.fixture
def fake(tmp_path):
    with serving(TOKEN, str(tmp_path / "fake-state.json")) as server:
        yield server


def state(server):
    return server.fake.state()


def playbook(server, tmp_path, name, token=TOKEN, *args):
    env = dict(os.environ, GLOWS_API_URL=server.url, GLOWS_SDK_TOKEN=token,
               GLOWS_RENTAL_FILE=str(tmp_path / "rental.json"), ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               ANSIBLE_NOCOLOR="1", PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    argv = [os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "playbooks/%s.yml" % name,
            "-e", "glows_rental_poll_s=0.2", "-e", "glows_rental_backoff_s=0.05"] + list(args)
    # Each -e as typed JSON, as the playbooks' first play asks (a key=value -e is text, and loses words to spaces).
    argv = [typed(word) if before == "-e" else word for before, word in zip([""] + argv, argv)]
    run = subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, timeout=300, check=False)
    # The console wraps long messages: compare with runs of white space made one space.
    run.said = " ".join(run.stdout.split())
    return run


def typed(assignment):
    """-e NAME=VALUE as JSON: VALUE a number or true/false when it reads as one, else text."""
    key, value = assignment.split("=", 1)
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = value
    return json.dumps({key: parsed if isinstance(parsed, (int, float, bool)) else value})


def recap_changed(out):
    line = [line for line in out.splitlines() if line.startswith("localhost ")][-1]
    return int(line.split("changed=")[1].split()[0])


def keys(server):
    return sorted(instance["metaKey"] for instance in state(server)["instances"])


def test_rent_is_idempotent_and_release_takes_exactly_the_rental(fake, tmp_path):
    # Someone else's instance, whose key shares the start of ours: release must leave it.
    outsider = playbook(fake, tmp_path, "glows-rent", TOKEN, "-e", "count=1", "-e", "gpu=" + GPU,
                        "-e", "prefix=prima-t-0x")
    assert outsider.returncode == 0, outsider.stdout
    os.unlink(tmp_path / "rental.json")

    rent = playbook(fake, tmp_path, "glows-rent", TOKEN, "-e", "count=3", "-e", "gpu=" + GPU, "-e", "prefix=prima-t")
    assert rent.returncode == 0, rent.stdout
    assert "3/3 Running" in rent.said and "$1.95 per hour" in rent.said
    assert keys(fake) == ["prima-t-0", "prima-t-0x-0", "prima-t-1", "prima-t-2"]
    record = json.loads((tmp_path / "rental.json").read_text())
    assert record["prefix"] == "prima-t" and len(record["instances"]) == 3
    assert oct(os.stat(tmp_path / "rental.json").st_mode & 0o777) == "0o600"
    passwords = [instance["sshCred"]["password"] for instance in state(fake)["instances"]]
    for password in passwords:
        assert password not in rent.stdout and password not in (tmp_path / "rental.json").read_text()

    # A re-run, the prefix from the rental file: nothing new.
    again = playbook(fake, tmp_path, "glows-rent", TOKEN, "-e", "count=3", "-e", "gpu=" + GPU)
    assert again.returncode == 0 and recap_changed(again.stdout) == 0, again.stdout
    assert len(keys(fake)) == 4

    shrink = playbook(fake, tmp_path, "glows-rent", TOKEN, "-e", "count=2", "-e", "gpu=" + GPU)
    assert shrink.returncode != 0 and "more than count=2 (prima-t-2)" in shrink.said, shrink.stdout

    release = playbook(fake, tmp_path, "glows-release", TOKEN)
    assert release.returncode == 0, release.stdout
    assert "released 3 instances under prefix prima-t; they cost about $" in release.said
    assert keys(fake) == ["prima-t-0x-0"]
    assert not (tmp_path / "rental.json").exists()

    nothing = playbook(fake, tmp_path, "glows-release", TOKEN, "-e", "prefix=prima-t")
    assert nothing.returncode == 0 and recap_changed(nothing.stdout) == 0, nothing.stdout
    assert "nothing to release under prefix prima-t" in nothing.said


def test_a_rent_that_times_out_releases_what_it_created_unless_told_to_keep(fake, tmp_path):
    post_faults(fake, schedule_s=600)
    failed = playbook(fake, tmp_path, "glows-rent", TOKEN, "-e", "count=2", "-e", "gpu=" + GPU, "-e", "prefix=prima-w",
                      "-e", "glows_rental_wait_timeout_s=2")
    assert failed.returncode != 0
    assert "not every instance was Running after 2 s" in failed.said, failed.stdout
    assert "released the instances this run created (prima-w-0, prima-w-1)" in failed.said
    assert keys(fake) == []

    kept = playbook(fake, tmp_path, "glows-rent", TOKEN, "-e", "count=1", "-e", "gpu=" + GPU, "-e", "prefix=prima-k",
                    "-e", "glows_rental_wait_timeout_s=1", "-e", "keep_on_failure=true")
    assert kept.returncode != 0 and "kept the 1 instances this run created (prima-k-0)" in kept.said, kept.stdout
    assert "glows-release.yml -e prefix=prima-k" in kept.said
    assert keys(fake) == ["prima-k-0"]


def test_rate_limits_are_retried_and_api_errors_stop_the_rent_cleanly(fake, tmp_path):
    post_faults(fake, rate_limit_next=2)
    rent = playbook(fake, tmp_path, "glows-rent", TOKEN, "-e", "count=1", "-e", "gpu=" + GPU, "-e", "prefix=prima-r",
                    "-e", "glows_rental_keep_on_failure=false")
    assert rent.returncode == 0, rent.stdout
    post_faults(fake, rate_limit_next=50)
    limited = playbook(fake, tmp_path, "glows-release", TOKEN, "-e", "prefix=prima-r")
    assert limited.returncode != 0 and "rate limited" in limited.said, limited.stdout
    post_faults(fake, rate_limit_next=0, error_next={"code": 88, "msg": "no stock of that GPU in TW-03", "count": 1})
    stock = playbook(fake, tmp_path, "glows-rent", TOKEN, "-e", "count=1", "-e", "gpu=" + GPU, "-e", "prefix=prima-s",
                     "-e", "glows_rental_file=%s" % (tmp_path / "other-rental.json"))
    assert stock.returncode != 0 and "no stock of that GPU in TW-03" in stock.said and "88" in stock.said


@pytest.mark.parametrize("args, needle", [
    (["-e", "count=0", "-e", "gpu=" + GPU, "-e", "prefix=prima-z"], "give -e count=N"),
    (["-e", "count=1", "-e", "prefix=prima-z"], "gpu_name is empty; give -e gpu="),
    (["-e", "count=1", "-e", "gpu=" + GPU, "-e", "prefix=Prima;rm"], "the rental prefix 'Prima;rm' is not"),
    (["-e", "count=1", "-e", "gpu=" + GPU, "-e", "prefix=prima-z", "-e", "snapshot=snap-1", "-e", "image=img-1"],
     None),
])
def test_bad_input_is_refused_before_any_instance_exists(fake, tmp_path, args, needle):
    run = playbook(fake, tmp_path, "glows-rent", TOKEN, *args)
    assert run.returncode != 0, run.stdout
    if needle:
        assert needle in run.said, run.stdout
    assert keys(fake) == []


def test_a_bad_token_and_a_release_without_a_rental_say_the_fix(fake, tmp_path):
    bad = playbook(fake, tmp_path, "glows-rent", "wrong", "-e", "count=1", "-e", "gpu=" + GPU, "-e", "prefix=prima-b")
    assert bad.returncode != 0 and "refused the token" in bad.said and "GLOWS_SDK_TOKEN" in bad.said, bad.stdout
    assert "wrong" not in bad.stdout.replace("wrong-", "")
    orphan = playbook(fake, tmp_path, "glows-release", TOKEN)
    assert orphan.returncode != 0 and "Nothing to release: no -e prefix=NAME" in orphan.said, orphan.stdout


def test_the_rental_file_is_guarded(fake, tmp_path):
    """A rental file that cannot be written stops the rent before anything exists; one that is no record, or that
    names another API, is refused instead of read as "no rental" (which would start a second one, or drop it)."""
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    unwritable = playbook(fake, tmp_path, "glows-rent", TOKEN, "-e", "count=1", "-e", "gpu=" + GPU,
                          "-e", "glows_rental_file=%s/rental.json" % blocked)
    assert unwritable.returncode != 0 and "not-a-dir/rental.json" in unwritable.said, unwritable.stdout
    assert keys(fake) == []

    rent = playbook(fake, tmp_path, "glows-rent", TOKEN, "-e", "count=1", "-e", "gpu=" + GPU, "-e", "prefix=prima-g")
    assert rent.returncode == 0, rent.stdout
    elsewhere = playbook(fake, tmp_path, "glows-release", TOKEN, "-e", "glows_rental_api_url=http://127.0.0.1:9/sdk/v1")
    assert elsewhere.returncode != 0 and "records prefix prima-g on the API %s" % fake.url in elsewhere.said
    another = playbook(fake, tmp_path, "glows-rent", TOKEN, "-e", "count=1", "-e", "gpu=" + GPU, "-e", "prefix=prima-h")
    assert another.returncode != 0 and "records another rental, prefix prima-g" in another.said, another.stdout

    text = (tmp_path / "rental.json").read_text()
    (tmp_path / "rental.json").write_text(text[:len(text) // 2])
    garbage = playbook(fake, tmp_path, "glows-release", TOKEN)
    assert garbage.returncode != 0 and "is not a rental record" in garbage.said, garbage.stdout
    assert keys(fake) == ["prima-g-0"]


def test_release_cancels_no_instance_a_lying_listing_pairs_with_the_rentals_key(fake, tmp_path):
    """A listing that pairs prima-victim-0 with another instance's id: release queries that id, sees the key is not
    the rental's, and refuses naming both, instead of cancelling the other instance by its id."""
    other = playbook(fake, tmp_path, "glows-rent", TOKEN, "-e", "count=1", "-e", "gpu=" + GPU,
                     "-e", "prefix=production-db", "-e", "glows_rental_file=%s" % (tmp_path / "other.json"))
    assert other.returncode == 0, other.stdout
    rent = playbook(fake, tmp_path, "glows-rent", TOKEN, "-e", "count=1", "-e", "gpu=" + GPU,
                    "-e", "prefix=prima-victim")
    assert rent.returncode == 0, rent.stdout
    ids = {i["metaKey"]: i["instanceID"] for i in state(fake)["instances"]}
    production = ids["production-db-0"]
    # Swapped, so the listing still names each id once.
    post_faults(fake, list_instance_ids={"prima-victim-0": production, "production-db-0": ids["prima-victim-0"]})

    release = playbook(fake, tmp_path, "glows-release", TOKEN, "-e", "glows_rental_wait_timeout_s=2")
    assert release.returncode != 0, release.stdout
    assert ("the listing pairs prima-victim-0 with instance %s, but the API says %s is production-db-0"
            % (production, production)) in release.said, release.stdout
    assert keys(fake) == ["prima-victim-0", "production-db-0"]
    assert (tmp_path / "rental.json").exists()
