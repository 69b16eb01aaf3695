"""The README, run as typed: every command tests/readme_commands.py classifies RUN goes through `bash -c` exactly as
README.md writes it (each variant of its [...] parts), from the checkout, with the .venv's bin/ first on PATH, and
must exit 0. Nothing in a command is substituted; the only changes are environment variables the README itself
documents: PRIMA_BENCH_REPORTS_DIR (a temporary directory), GLOWS_API_URL, GLOWS_SDK_TOKEN and GLOWS_RENTAL_FILE
(the fake Glows API), ANSIBLE_COLLECTIONS_PATH (where the collection is installed).

Setups: "none" runs anywhere; "fake Glows API" against tests/fakes/glows_api.py without nodes (loopback only),
checking that the API received the GPU's full name; "sandbox provisioned" in README order on the shared provisioned
sandbox (conftest.py's provisioned fixture): site, bench, serve with the tunnel and curl it prints, status, stop,
readiness. Each command's output is in artifacts/readme-*.log, the seconds each took in
artifacts/readme-commands-figures.json."""

import glob
import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from ansible_collections.prima.cluster.tests import readme_commands as rc
from ansible_collections.prima.cluster.tests.fakes.glows_api import serving as glows_serving
from conftest import ARTIFACTS, REPO, SITE_AS_TYPED, run_playbook, write_figures

VENV_BIN = os.path.join(REPO, ".venv", "bin")
TOKEN = "readme-sdk-token"
GPU = "NVIDIA GeForce RTX 4090"
TUNNEL = "1. The tunnel, in a terminal of its own:"
CURL = "2. A chat completion"
SECONDS = {}  # command as run -> seconds


def as_typed(text, label, **env):
    """`text` through bash -c, as a person types it in the checkout after `. .venv/bin/activate`."""
    assert os.path.isdir(VENV_BIN), "no .venv in the checkout (make venv)"
    environment = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""), **env)
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", text], cwd=REPO, env=environment, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=3600,
                          check=False)
    SECONDS[text] = round(time.monotonic() - started, 1)
    os.makedirs(ARTIFACTS, exist_ok=True)
    done.log_path = os.path.join(ARTIFACTS, "readme-%s.log" % label)
    with open(done.log_path, "w") as handle:
        handle.write("$ %s\n%s" % (text, done.stdout))
    return done


def said(done):
    return "exit %s: %s\n(log: %s)\n%s" % (done.returncode, done.args[-1], done.log_path, done.stdout[-6000:])


@pytest.fixture(scope="module", autouse=True)
def figures():
    yield
    if SECONDS:
        write_figures("readme-commands-figures.json", {"seconds": SECONDS})


def test_the_classification_has_something_to_run_for_every_setup():
    for setup in rc.SETUPS:
        assert list(rc.to_run(setup)), "no README command runs with setup %r" % setup


def test_commands_that_need_no_setup(tmp_path):
    collections = tmp_path / "collections"
    for index, (dummy, variant) in enumerate(rc.to_run(rc.NONE)):
        done = as_typed(variant, "none-%d" % index, ANSIBLE_COLLECTIONS_PATH=str(collections))
        assert done.returncode == 0, said(done)
    if any("ansible-galaxy collection install" in variant for dummy, variant in rc.to_run(rc.NONE)):
        assert glob.glob(str(collections / "ansible_collections" / "prima" / "cluster" / "MANIFEST.json"))


@pytest.fixture
def fake_glows(tmp_path):
    """The fake Glows API without nodes; `-e snapshot=ID` of the README names a snapshot it knows."""
    with glows_serving(TOKEN, str(tmp_path / "fake-state.json"), snapshots={"ID": str(tmp_path)}) as server:
        yield server


def test_rent_and_release_against_the_fake_glows_api(fake_glows, tmp_path):
    """Each variant of each rent command, then every release command, on a rental file of its own: the API gets
    the GPU's whole name, and nothing is left rented."""
    commands = [variant for dummy, variant in rc.to_run(rc.FAKE_GLOWS)]
    rents = [variant for variant in commands if "glows-rent.yml" in variant]
    releases = [variant for variant in commands if "glows-release.yml" in variant]
    assert rents and releases and len(rents) + len(releases) == len(commands), commands
    for index, rent in enumerate(rents):
        env = {"GLOWS_API_URL": fake_glows.url, "GLOWS_SDK_TOKEN": TOKEN,
               "GLOWS_RENTAL_FILE": str(tmp_path / ("rental-%d.json" % index))}
        done = as_typed(rent, "glows-rent-%d" % index, **env)
        assert done.returncode == 0, said(done)
        instances = fake_glows.fake.state()["instances"]
        assert instances, said(done)
        assert {instance["hardware"]["gpuName"] for instance in instances} == {GPU}, instances
        for number, release in enumerate(releases):
            done = as_typed(release, "glows-release-%d-%d" % (index, number), **env)
            assert done.returncode == 0, said(done)
        assert fake_glows.fake.state()["instances"] == []


def printed(stdout, prefix):
    """The command a playbook printed after the line starting with `prefix` (on that line, or on the next),
    as a person copies it from the terminal; None when it printed none."""
    lines = stdout.splitlines()
    for index, line in enumerate(lines):
        if not line.strip().startswith(prefix):
            continue
        rest = line.strip()[len(prefix):].strip()
        if rest.startswith(("ssh ", "curl ")):
            return rest
        following = [text.strip() for text in lines[index + 1:] if text.strip()]
        return following[0] if following else None
    return None


def port_free(port):
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def tunnel_and_curl(done, label):
    """The two commands serve.yml printed, typed as printed: the tunnel in a terminal of its own (here a process
    group of its own), then the curl, until the ring answers through the tunnel."""
    tunnel, curl = printed(done.stdout, TUNNEL), printed(done.stdout, CURL)
    assert tunnel and tunnel.startswith("ssh ") and curl and curl.startswith("curl "), (
        "serve.yml printed no tunnel and curl to paste as they are\n" + said(done))
    local = re.search(r"-L '?(\d+):", tunnel)
    assert local, tunnel
    assert port_free(int(local.group(1))), "the controller's port %s (the printed tunnel's) is taken" % local.group(1)
    environment = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    with open(os.path.join(ARTIFACTS, "readme-%s-tunnel.log" % label), "w") as log:
        process = subprocess.Popen(["bash", "-c", tunnel], cwd=REPO, env=environment, stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            answered = as_typed(curl, label + "-curl")
            try:
                answer = json.loads(answered.stdout)
            except ValueError:
                answer = None
            if answered.returncode == 0 and isinstance(answer, dict) and answer.get("choices"):
                break
            assert process.poll() is None, "the printed tunnel exited (%s)" % process.returncode
            assert time.monotonic() < deadline, "no answer through the printed tunnel and curl\n" + said(answered)
            time.sleep(1)
        assert answer["choices"][0]["message"]["role"] == "assistant", answer
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def test_the_sandbox_step_by_step(provisioned, tmp_path):
    """'Sandbox, step by step' in its order (site, bench, serve, the printed tunnel and curl, status, stop,
    readiness) on the provisioned sandbox; a server left by a failure is stopped at the end."""
    reports = tmp_path / "reports"
    reports.mkdir()
    commands = list(rc.to_run(rc.SANDBOX))
    assert SITE_AS_TYPED in [variant for dummy, variant in commands], "the README's site command is no longer " \
        "%r: conftest.SITE_AS_TYPED runs it as the session's second site.yml" % SITE_AS_TYPED
    serving = False
    try:
        for index, (dummy, variant) in enumerate(commands):
            label = "sandbox-%d" % index
            starts = "serve.yml" in variant and not re.search(r"state=(stopped|status)\b", variant)
            serving = serving or starts
            if variant == SITE_AS_TYPED:
                # site_runs ran it as typed, as the session's second site.yml (changed=0 there: test_site).
                second = provisioned[1]
                assert second.rc == 0, second.describe()
                SECONDS[variant] = round(second.seconds, 1)
                continue
            done = as_typed(variant, label, PRIMA_BENCH_REPORTS_DIR=str(reports))
            assert done.returncode == 0, said(done)
            if "serve.yml" in variant and "state=stopped" in variant:
                serving = False
            if starts:
                tunnel_and_curl(done, label)
            if " bench.yml" in variant:
                assert glob.glob(str(reports / "*" / "report.md")), "bench.yml wrote no report\n" + said(done)
                assert (reports / "results.jsonl").read_text().strip(), said(done)
            if " report.yml" in variant:
                # The newest run's report made again from its raw logs: beside the first, the same text.
                [first] = glob.glob(str(reports / "*" / "report.md"))
                again = glob.glob(os.path.join(os.path.dirname(first), "report-again-*.md"))
                assert len(again) == 1 and "bench report: %s" % again[0] in done.stdout, said(done)
                with open(first) as original, open(again[0]) as made:
                    assert made.read() == original.read()
    finally:
        if serving:
            stopped = run_playbook("serve.yml", extravars={"state": "stopped"}, label="readme-serve-cleanup")
            assert stopped.status == "successful", stopped.describe()
