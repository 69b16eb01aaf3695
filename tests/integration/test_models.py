"""The weights on the sandbox: one download per cluster, resume, corruption, bad bytes, disk, what the hub says.

The sandbox's hub (its own namespace, 10.77.0.2:8088, roles/sandbox/files/hub_server.py)
logs every response it serves, so each test can count the bytes that crossed the hub link.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

import ansible_runner
import pytest
import yaml

from conftest import NODES, REPO, SANDBOX_INVENTORY, local_fact, node, run_playbook

HUB_LOG = "/var/lib/prima-sandbox/hub-requests.log"
HUB_DIR = "/var/cache/prima-sandbox/hub"
LOCK = "/var/lib/prima-sandbox/models.lock.json"
NODE_ROOT = "/var/lib/prima-sandbox/nodes/%s/root"
HUB_SERVER = os.path.join(REPO, "roles/sandbox/files/hub_server.py")


def hub_commit(repo, ref="main"):
    with open(os.path.join(HUB_DIR, repo, "refs", ref)) as handle:
        return handle.read().strip()


def hub_file(repo, name, ref="main"):
    return os.path.join(HUB_DIR, repo, "commits", hub_commit(repo, ref), name)


def publish(repo, files, *options):
    """A new commit of `repo` on the sandbox hub holding `files` ({name: bytes}); main moves to it."""
    with tempfile.TemporaryDirectory(prefix="hub-staging-") as staging:
        for name, data in files.items():
            with open(os.path.join(staging, name), "wb") as handle:
                handle.write(data)
        done = subprocess.run([sys.executable, HUB_SERVER, "publish", "--repo-dir", os.path.join(HUB_DIR, repo),
                               "--from", staging] + list(options), check=True, capture_output=True, text=True)
    return done.stdout.strip()


def tiny_on_hub():
    """The tiny model as the sandbox hub serves it (the hub exists once the session's sandbox is up)."""
    return hub_file("sandbox/tiny", "tiny.gguf")


def hub_records():
    with open(HUB_LOG) as handle:
        return [json.loads(line) for line in handle]


def served_since(mark, name):
    """The downloads of `name` (the CDN's answers; the hub's own 302s and HEADs carry no bytes)."""
    return [record for record in hub_records()[mark:]
            if record["path"].startswith("/cdn/") and record["path"].endswith("/" + name)]


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def shape_hub(rate):
    """tbf on the hub's link only; the nodes' links stay as they are."""
    argv = ["ip", "netns", "exec", "psb-hub", "tc", "qdisc"]
    if rate:
        subprocess.run(argv + ["replace", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "32kb",
                               "latency", "400ms"], check=True)
    else:
        subprocess.run(argv + ["del", "dev", "eth0", "root"], check=False, stderr=subprocess.DEVNULL)


def remove_weights():
    for name in NODES:
        node(name).run_expect([0], "rm -f /opt/models/tiny.gguf /opt/models/tiny.gguf.partial "
                                   "/opt/models/tiny.gguf.verified")


def assert_tiny_everywhere():
    expected = sha256_file(tiny_on_hub())
    for name in NODES:
        host = node(name)
        assert host.file("/opt/models/tiny.gguf").sha256sum == expected, name
        assert not host.file("/opt/models/tiny.gguf.partial").exists, name
        assert local_fact(host, "models")["tiny.gguf"]["sha256"] == expected


@pytest.fixture
def hub_shaping():
    yield shape_hub
    shape_hub(None)


def test_site_put_verified_tiny_on_every_node_with_one_hub_download(site_runs):
    assert_tiny_everywhere()
    tiny = tiny_on_hub()
    with open(LOCK) as handle:
        assert json.load(handle)["sandbox/tiny@main/tiny.gguf"] == {
            "sha256": sha256_file(tiny), "commit": hub_commit("sandbox/tiny"), "size": os.path.getsize(tiny)}
    assert sum(record["bytes"] for record in served_since(0, "tiny.gguf")) == os.path.getsize(tiny)


def test_rerun_downloads_nothing(site_runs):
    # The session's second site.yml ran the models play again on the provisioned nodes.
    run = site_runs[1]
    assert run.status == "successful", run.describe()
    assert {host: n for host, n in run.count("changed").items() if n} == {}, run.describe()
    assert run.hub_requests == []


def test_download_killed_half_way_resumes(site_runs, hub_shaping, tmp_path):
    remove_weights()
    hub_shaping("16mbit")
    mark = len(hub_records())
    partial = NODE_ROOT % "n0" + "/opt/models/tiny.gguf.partial"
    state = {"stop": False}
    (tmp_path / "runner").mkdir()
    thread, runner = ansible_runner.run_async(
        private_data_dir=str(tmp_path / "runner"), project_dir=REPO,
        playbook="playbooks/models.yml", inventory=SANDBOX_INVENTORY, quiet=True,
        envvars={"ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg")}, cancel_callback=lambda: state["stop"])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (os.path.exists(partial) and os.path.getsize(partial) > 12 << 20):
        time.sleep(0.2)
    assert os.path.exists(partial), "the download never started"
    state["stop"] = True
    thread.join(60)
    node("n0").run("pkill -f AnsiballZ_hub_download")
    time.sleep(1)
    kept = os.path.getsize(partial)
    assert 0 < kept < os.path.getsize(tiny_on_hub())
    assert not node("n0").file("/opt/models/tiny.gguf").exists

    hub_shaping(None)
    resumed_mark = len(hub_records())
    run = run_playbook("playbooks/models.yml", label="models-resume")
    assert run.status == "successful", run.describe()
    assert_tiny_everywhere()
    second = served_since(resumed_mark, "tiny.gguf")
    assert second and second[0]["range"] is not None and second[0]["status"] == 206, second
    assert sum(record["bytes"] for record in second) < os.path.getsize(tiny_on_hub())
    # Both runs together: the whole file once, plus what was in flight when the first was killed.
    assert sum(record["bytes"] for record in served_since(mark, "tiny.gguf")) < 1.1 * os.path.getsize(tiny_on_hub())


def test_flipped_byte_is_detected_and_fetched_again_and_a_two_part_model_arrives(site_runs):
    """One models.yml run for both: tiny (a byte flipped on n1) and the two-part tiny-split, new to the nodes."""
    target = NODE_ROOT % "n1" + "/opt/models/tiny.gguf"
    with open(target, "r+b") as handle:
        handle.seek(4096)
        byte = handle.read(1)
        handle.seek(4096)
        handle.write(bytes([byte[0] ^ 0x01]))
    assert sha256_file(target) != sha256_file(tiny_on_hub())
    mark = len(hub_records())
    run = run_playbook("playbooks/models.yml", extravars={"model": "tiny,tiny-split"}, label="models-flipped-split")
    assert run.status == "successful", run.describe()
    assert run.count("changed").get("n1", 0) > 0
    assert_tiny_everywhere()
    assert served_since(mark, "tiny.gguf") == [], "the repair came from the hub, not from the source node"
    # The two-part model: each part once from the hub, locked, and on every node.
    parts = ["tiny-00001-of-00002.gguf", "tiny-00002-of-00002.gguf"]
    with open(LOCK) as handle:
        lock = json.load(handle)
    for part in parts:
        digest = sha256_file(hub_file("sandbox/tiny-split", part))
        assert lock["sandbox/tiny-split@main/" + part]["sha256"] == digest
        assert len(served_since(mark, part)) == 1
        for name in NODES:
            assert node(name).file("/opt/models/" + part).sha256sum == digest


def said(run, text):
    """Whether the run's output holds `text`, however the YAML callback wrapped its lines."""
    return " ".join(text.split()) in " ".join(run.stdout.split())


def inventory_catalog(**extra):
    with open(os.path.join(REPO, "inventory/group_vars/sandbox.yml")) as handle:
        catalog = yaml.safe_load(handle)["models_extra_catalog"]
    catalog.update(extra)
    return catalog


def small_model(repo, name, data, sha256=None):
    return {"hub_repo": repo, "revision": "main", "n_layer": 8,
            "files": [{"name": name, "size": len(data), "sha256": sha256}]}


def test_a_hub_whose_digest_disagrees_fails_and_installs_nothing(site_runs):
    with open(tiny_on_hub(), "rb") as source:
        data = bytearray(source.read(4 << 20))
    data[len(data) // 2] ^= 0xFF
    honest = hashlib.sha256(data).hexdigest()
    claimed = hashlib.sha256(bytes(4 << 20)).hexdigest()
    publish("sandbox/liar", {"liar.gguf": bytes(data)}, "--claim", "liar.gguf=" + claimed)
    catalog = inventory_catalog(liar=small_model("sandbox/liar", "liar.gguf", data))
    # The hub's X-Linked-Etag is what the bytes are checked against: they do not match it.
    run = run_playbook("playbooks/models.yml", extravars={"models_extra_catalog": catalog, "model": "liar"},
                       label="models-lying-hub")
    assert run.status == "failed", run.describe()
    assert said(run, "sha256 of the downloaded liar.gguf is %s, expected %s (from the hub)" % (honest, claimed))
    # A catalog pin the hub disagrees with stops the run before any byte is fetched.
    mark = len(hub_records())
    catalog["liar"]["files"][0]["sha256"] = honest
    run = run_playbook("playbooks/models.yml", extravars={"models_extra_catalog": catalog, "model": "liar"},
                       label="models-hub-disagrees")
    assert run.status == "failed", run.describe()
    assert said(run, "the hub says its sha256 is %s, the catalog says %s; nothing was downloaded" % (claimed, honest))
    assert served_since(mark, "liar.gguf") == []
    for name in NODES:
        host = node(name)
        assert not host.file("/opt/models/liar.gguf").exists, name
        assert not host.file("/opt/models/liar.gguf.partial").exists, name


def test_a_moving_repository_is_held_to_the_locked_commit(site_runs, tmp_path):
    """And a file without LFS headers is pinned by its first download, with a NOTICE."""
    first, moved, plain = os.urandom(1 << 20), os.urandom(1 << 20), os.urandom(1 << 19)
    first_commit = publish("sandbox/moving", {"moving.gguf": first})
    plain_commit = publish("sandbox/plain", {"plain.gguf": plain}, "--no-lfs", "plain.gguf")
    catalog = inventory_catalog(moving=small_model("sandbox/moving", "moving.gguf", first),
                                plain=small_model("sandbox/plain", "plain.gguf", plain))
    lock = str(tmp_path / "models.lock.json")
    extravars = {"models_extra_catalog": catalog, "model": "moving,plain", "models_lock_file": lock}
    try:
        run = run_playbook("playbooks/models.yml", extravars=extravars, label="models-moving-first")
        assert run.status == "successful", run.describe()
        assert said(run, "NOTICE: plain.gguf (sandbox/plain at %s): the hub gives no LFS digest (X-Linked-Etag)"
                    % plain_commit[:12])
        with open(lock) as handle:
            assert json.load(handle) == {
                "sandbox/moving@main/moving.gguf": {"sha256": hashlib.sha256(first).hexdigest(),
                                                    "commit": first_commit, "size": len(first)},
                "sandbox/plain@main/plain.gguf": {"sha256": hashlib.sha256(plain).hexdigest(),
                                                  "commit": plain_commit, "size": len(plain)}}
        moved_commit = publish("sandbox/moving", {"moving.gguf": moved})
        node("n0").run_expect([0], "rm -f /opt/models/moving.gguf /opt/models/moving.gguf.verified")
        mark = len(hub_records())
        run = run_playbook("playbooks/models.yml", extravars=extravars, label="models-moving-held")
        assert run.status == "successful", run.describe()
        assert said(run, "NOTICE: sandbox/moving@main has moved to %s; %s holds moving.gguf to commit %s"
                    % (moved_commit[:12], lock, first_commit[:12]))
        assert [record["path"] for record in served_since(mark, "moving.gguf")] == \
            ["/cdn/sandbox/moving/%s/moving.gguf" % first_commit]
        for name in NODES:
            assert node(name).file("/opt/models/moving.gguf").sha256sum == hashlib.sha256(first).hexdigest()
    finally:
        for name in NODES:
            node(name).run("rm -f /opt/models/moving.gguf* /opt/models/plain.gguf*")


def test_too_little_disk_fails_before_any_download(site_runs):
    for name in NODES:
        node(name).run_expect([0], "rm -rf /opt/models-small")
    # Mounted from inside the node, so that its sshd sessions see it.
    node("n2").run_expect([0], "mkdir -p /opt/models-small && mount -t tmpfs -o size=16m tmpfs /opt/models-small")
    try:
        mark = len(hub_records())
        run = run_playbook("playbooks/models.yml", extravars={"cluster_models_dir": "/opt/models-small"},
                           label="models-small-disk")
        assert run.status == "failed", run.describe()
        assert "n2: /opt/models-small has 0.02 GiB free; the selected weights need 0.05 GiB more" in run.stdout
        assert hub_records()[mark:] == []
        assert not node("n0").file("/opt/models-small/tiny.gguf.partial").exists
    finally:
        node("n2").run_expect([0], "umount /opt/models-small")
        for name in NODES:
            node(name).run_expect([0], "rm -rf /opt/models-small")


# Slow enough that the hub is the bottleneck (the nodes' links are not shaped) and the download shows progress
# lines (every 5 s). The wall times of both ways at this rate are benchmarks/models_fanout.py's (make figures).
HUB_RATE = "20mbit"


def test_fanout_downloads_once_and_every_node_thrice(site_runs, hub_shaping):
    """Hub bytes of both ways for 3 nodes: the fan-out with the hub's link shaped (its progress lines show),
    every node downloading on an unshaped link (bytes, not time, are what it shows)."""
    for fanout, rate, per_model in ((True, HUB_RATE, 1.0), (False, None, 3.0)):
        remove_weights()
        hub_shaping(rate)
        mark = len(hub_records())
        run = run_playbook("playbooks/models.yml", extravars={"models_fanout": fanout},
                           label="models-" + ("fanout" if fanout else "every-node"))
        assert run.status == "successful", run.describe()
        assert_tiny_everywhere()
        served = sum(record["bytes"] for record in served_since(mark, "tiny.gguf"))
        assert served / os.path.getsize(tiny_on_hub()) == per_model, (fanout, served)
        if not fanout:
            # The second run has the first's transport inputs (an earlier test's models directory is one of them):
            # it uses the transport as set up, and writes none of its files again.
            assert "Render this node's forwarders" not in run.stdout, run.describe()
        if fanout:
            assert "tiny.gguf downloading" in run.stdout, "no progress lines"
