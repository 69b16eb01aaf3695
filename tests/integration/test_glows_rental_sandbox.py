"""The whole life of a Glows rental on the sandbox, through the fake Glows API (tests/fakes/glows_api.py) and
the same inventory plugin, playbooks and reports as on Glows: rent 3 (real sandbox nodes, reached through
mapped SSH ports with a root password), first contact by password, site.yml, bench.yml with the fake's prices
in the report, release. Afterwards nothing is left: no node, no namespace, no instance in the fake.

The instances are rented from the snapshot of n0 that site_runs took once it had provisioned it (conftest.SNAPSHOT_ROOT;
from_snap_id, as a user who saved a provisioned node would): site.yml still runs every role on them, and the
builds find their stamps."""

import glob
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import PRIMA_EXTRAVARS, REPO, SNAPSHOT_ROOT, run_playbook, write_figures

BIN = os.path.dirname(sys.executable)
TOKEN = "sandbox-sdk-token"
PRICE_CENT = 65
PORT = 18780  # inventory/sandbox-glows.glows.yml's api_url
INVENTORY = os.path.join(REPO, "inventory", "sandbox-glows.glows.yml")
PREFIX = "prima-sbx"
HOSTS = ["prima-sbx-0", "prima-sbx-1", "prima-sbx-2"]
SANDBOX_KEY = "/var/lib/prima-sandbox/ssh/id_ed25519"

_spec = importlib.util.spec_from_file_location("glows_api_fake", os.path.join(REPO, "tests", "fakes", "glows_api.py"))
assert _spec is not None and _spec.loader is not None
glows = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(glows)


def leftovers():
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout.split()
    return [name for name in namespaces if name.startswith("psb-g")]


def pristine_root():
    roots = [os.path.dirname(stamp) + "/root" for stamp in glob.glob("/var/cache/prima-sandbox/pristine-*/complete")]
    assert len(roots) == 1, "expected one pristine root of the sandbox, found %s" % roots
    return roots[0]


@pytest.fixture(scope="module")
def fake_glows(site_runs, tmp_path_factory):
    state = tmp_path_factory.mktemp("glows") / "fake-state.json"
    with glows.serving(TOKEN, str(state), port=PORT, sandbox=True, price_cent=PRICE_CENT,
                       images={glows.DEFAULT_IMAGE: pristine_root()},
                       snapshots={"snap-provisioned": SNAPSHOT_ROOT}) as server:
        yield server
    assert leftovers() == []


def env(tmp_path, server):
    return {"GLOWS_API_URL": server.url, "GLOWS_SDK_TOKEN": TOKEN, "GLOWS_RENTAL_FILE": str(tmp_path / "rental.json"),
            "PRIMA_BENCH_REPORTS_DIR": str(tmp_path / "reports"), "PRIMA_BENCH_RUN_ID": "glows-1"}


def fake_state(server):
    return server.fake.state()


def test_rent_provision_bench_release(fake_glows, tmp_path):
    envvars = env(tmp_path, fake_glows)
    (tmp_path / "reports").mkdir()
    rent = run_playbook("playbooks/glows-rent.yml", extravars={"count": 3, "gpu": "NVIDIA GeForce RTX 4090",
                                                               "snapshot": "snap-provisioned", "prefix": PREFIX,
                                                               "glows_rental_poll_s": 1},
                        envvars=envvars, label="glows-rent")
    assert rent.status == "successful", rent.describe()
    passwords = [instance["sshCred"]["password"] for instance in fake_state(fake_glows)["instances"]]
    assert len(passwords) == 3 and all(passwords)
    try:
        # What Ansible sees: the three instances, ranked, reached through the access gateway; no password.
        listed = subprocess.run([os.path.join(BIN, "ansible-inventory"), "-i", INVENTORY, "--list"], cwd=REPO,
                                env=dict(os.environ, **envvars), capture_output=True, text=True, check=True)
        inventory = glows.plain(json.loads(listed.stdout))
        assert inventory["cluster"]["hosts"] == HOSTS
        for host in HOSTS:
            hostvars = inventory["_meta"]["hostvars"][host]
            assert hostvars["ansible_host"] == "10.77.0.3" and hostvars["glows_price_cent"] == PRICE_CENT
            assert hostvars["gpu_name"] == "NVIDIA GeForce RTX 4090" and hostvars["ansible_user"] == "root"
        assert not any(password in listed.stdout + listed.stderr for password in passwords)

        # First contact: the root password from the API (no vault), then the sandbox's key.
        keys = run_playbook("playbooks/glows-keys.yml", inventory=INVENTORY, envvars=envvars, label="glows-rent-keys",
                            extravars={"glows_public_key": SANDBOX_KEY + ".pub"}, cmdline="-vvv")
        assert keys.status == "successful", keys.describe()
        assert not any(password in keys.stdout for password in passwords)

        site = run_playbook("site.yml", inventory=INVENTORY, envvars=envvars, extravars=PRIMA_EXTRAVARS,
                            label="glows-rent-site")
        assert site.status == "successful", site.describe()

        bench = run_playbook("bench.yml", inventory=INVENTORY, envvars=envvars, label="glows-rent-bench",
                             extravars=dict(PRIMA_EXTRAVARS, model="tiny", runtime="llama_rpc", runs=1))
        assert bench.status == "successful", bench.describe()
        report = (tmp_path / "reports" / "glows-1" / "report.md").read_text()
        said = " ".join(report.split())
        assert "| Price ($/h) | 0.65 | 0.65 | 0.65 |" in said, report
        assert "Cost of this run: $" in said and "3 nodes, $1.95/h together" in said, report
        rows = [json.loads(line) for line in (tmp_path / "reports" / "results.jsonl").read_text().splitlines()]
        assert rows and all(isinstance(row.get("usd_per_mtok"), float) and row["usd_per_mtok"] > 0 for row in rows)
    finally:
        release = run_playbook("playbooks/glows-release.yml", envvars=envvars, label="glows-release",
                               extravars={"glows_rental_poll_s": 1})
    assert release.status == "successful", release.describe()
    cost_line = next(line for line in report.splitlines() if line.startswith("Cost of this run"))
    write_figures("glows-rental-figures.json", {
        "command": "pytest tests/integration/test_glows_rental_sandbox.py (3 instances from a snapshot of provisioned n0)",
        "seconds": {"rent": round(rent.seconds, 1), "first_contact": round(keys.seconds, 1),
                    "site": round(site.seconds, 1), "bench": round(bench.seconds, 1),
                    "release": round(release.seconds, 1)},
        "report_cost_line": cost_line, "usd_per_mtok": [row["usd_per_mtok"] for row in rows]})
    assert fake_state(fake_glows)["instances"] == []
    assert leftovers() == []
    assert not glob.glob("/var/lib/prima-sandbox/nodes/g*")
