"""The fake Glows API with --sandbox: an instance is a real sandbox node behind the access gateway, reached with its
root password only, firewalled from the other nodes, and gone without a trace once cancelled. Also measures
create -> Running from the pristine image and from a snapshot of a live node's root (artifacts/glows-fake.json)."""

import hashlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import yaml

from conftest import ACCESS_ADDRESS, REPO, write_figures

FAKE_PY = os.path.join(REPO, "tests", "fakes", "glows_api.py")
TOKEN = "sandbox-token"
N0_ROOT = "/var/lib/prima-sandbox/nodes/n0/root"


def pristine_root():
    """roles/sandbox/vars/main.yml's sandbox_pristine_root: the cache dir named by the recipe's hash."""
    with open(os.path.join(REPO, "roles", "sandbox", "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle)
    recipe = {"suite": defaults["sandbox_suite"], "mirror": defaults["sandbox_mirror"],
              "security_mirror": defaults["sandbox_security_mirror"], "packages": defaults["sandbox_pristine_packages"],
              "proxy": "http://%s:%s" % (defaults["sandbox_gateway"], defaults["sandbox_proxy_port"]), "revision": 1}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return os.path.join(defaults["sandbox_cache_dir"], "pristine-%s" % digest, "root")


def call(url, method="GET", payload=None, **params):
    request = urllib.request.Request(url + ("?" + urllib.parse.urlencode(params) if params else ""), method=method,
                                     data=json.dumps(payload).encode() if payload is not None else None,
                                     headers={"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=180) as response:
        return json.loads(response.read())


def fake_state(root):
    with urllib.request.urlopen(root + "/_fake/state", timeout=30) as response:
        return json.loads(response.read())


def wait_running(url, instance_id, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        instance = call(url + "/instance", request_id=instance_id)["instance"]
        assert instance["status"] in ("SchedQueued", "Running"), instance
        if instance["status"] == "Running":
            return instance
        time.sleep(0.2)
    raise AssertionError("%s not Running within %ds" % (instance_id, timeout))


def ssh(port, password, command, timeout=60):
    return subprocess.run(["sshpass", "-e", "ssh", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                           "-o", "PubkeyAuthentication=no", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
                           "-p", str(port), "root@" + ACCESS_ADDRESS, command],
                          env=dict(os.environ, SSHPASS=password), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=timeout, check=False)


def access_rules():
    done = subprocess.run(["ip", "netns", "exec", "psb-access", "nft", "list", "ruleset"], stdout=subprocess.PIPE,
                          universal_newlines=True, check=True)
    return done.stdout


def test_a_fake_instance_is_a_node_reached_by_password_and_gone_after_cancel(sandbox, tmp_path):
    state_file = str(tmp_path / "glows.json")
    process = subprocess.Popen([sys.executable, FAKE_PY, "serve", "--port", "0", "--token", TOKEN, "--state-file",
                                state_file, "--sandbox", "--image", "img-sandbox=" + pristine_root(),
                                "--snapshot", "snap-n0=" + N0_ROOT],
                               stdout=subprocess.PIPE, stderr=open(str(tmp_path / "fake.log"), "w"),
                               universal_newlines=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("listening on "), (line, open(str(tmp_path / "fake.log")).read())
        url = line.split()[-1]
        root = url[:-len("/sdk/v1")]
        body = {"gpu_name": "NVIDIA GeForce RTX 4090", "instance_category": "container", "region_name": "TW-03"}

        started = time.monotonic()
        created = call(url + "/instance", "POST", dict(body, from_image_id="img-sandbox", custom_meta_key="it.image"))
        assert created["code"] == 0 and created["instance"]["status"] == "SchedQueued", created
        instance = wait_running(url, created["instance"]["instanceID"])
        from_image_s = time.monotonic() - started
        assert instance["baseImage"]["imageName"].endswith("(sandbox: Debian bullseye)")
        ssh_url = [access["url"] for access in instance["accesses"] if access["protocol"] == "ssh"][0]
        match = re.fullmatch(r"ssh://%s:(\d+)" % re.escape(ACCESS_ADDRESS), ssh_url)
        assert match, ssh_url
        port, password = int(match.group(1)), instance["sshCred"]["password"]
        node = [item for item in fake_state(root)["instances"] if item["instanceID"] == instance["instanceID"]][0]
        name = node["_fake"]["node"]

        logged_in = ssh(port, password, "cat /etc/hostname")
        assert logged_in.returncode == 0, logged_in.stderr
        assert logged_in.stdout.strip() == name  # the nodes share the host's UTS namespace: not `hostname`
        assert ssh(port, "wrong-" + password, "true").returncode != 0
        # Firewalled like the mapped topology's nodes: n0's sshd is closed to it, the hub is open.
        probe = "timeout 5 bash -c 'exec 3<>/dev/tcp/%s/%d' && echo open || echo closed"
        assert ssh(port, password, probe % ("10.77.0.10", 22)).stdout.strip() == "closed"
        assert ssh(port, password, probe % ("10.77.0.2", 8088)).stdout.strip() == "open"

        # A snapshot of n0's live root (proc, sys, dev and binds mounted in it): its own host keys, no key.
        started = time.monotonic()
        snap = call(url + "/instance", "POST", dict(body, from_snap_id="snap-n0", custom_meta_key="it.snap"))
        assert snap["code"] == 0, snap
        snap_instance = wait_running(url, snap["instance"]["instanceID"])
        from_snapshot_s = time.monotonic() - started
        snap_port = int(snap_instance["accesses"][0]["url"].rsplit(":", 1)[1])
        checked = ssh(snap_port, snap_instance["sshCred"]["password"],
                      "test ! -e /root/.ssh/authorized_keys && cat /etc/ssh/ssh_host_ed25519_key.pub")
        assert checked.returncode == 0, checked.stderr
        with open(os.path.join(N0_ROOT, "etc/ssh/ssh_host_ed25519_key.pub")) as handle:
            assert checked.stdout.split()[1] != handle.read().split()[1]

        table = fake_state(root)["access_table"]
        assert "table ip %s" % table in access_rules()
        names = [name] + [item["_fake"]["node"] for item in fake_state(root)["instances"]
                          if item["instanceID"] == snap_instance["instanceID"]]
        ports = [port, snap_port]
        for instance_id in (instance["instanceID"], snap_instance["instanceID"]):
            assert call(url + "/instance", "DELETE", request_id=instance_id) == {"code": 0, "msg": ""}
        assert call(url + "/instance", "DELETE", request_id=instance["instanceID"])["code"] == 10

        # Nothing left, as soon as cancel has answered.
        netns = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
        for gone in names:
            assert "psb-" + gone not in netns
            assert not os.path.exists("/var/lib/prima-sandbox/nodes/" + gone)
            assert not os.path.exists("/var/lib/prima-sandbox/nft/%s.nft" % gone)
        rules = access_rules()
        assert table not in rules and all("dport %d " % gone not in rules for gone in ports)
        assert "prima_access" in rules
        assert fake_state(root)["instances"] == [] and fake_state(root)["nodes"] == []
        write_figures("glows-fake.json", {"create_to_running_s": {"image": round(from_image_s, 1),
                                                                  "snapshot_of_live_n0": round(from_snapshot_s, 1)}})
    finally:
        process.terminate()
        process.wait(30)
        subprocess.run([sys.executable, FAKE_PY, "cleanup", "--state-file", state_file], check=False)
