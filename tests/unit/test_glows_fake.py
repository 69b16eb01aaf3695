"""The fake Glows API (tests/fakes/glows_api.py) without nodes: every endpoint, paging, errors, faults, the
state file and cleanup. Loopback only."""

import http.client
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE_PY = os.path.join(REPO, "tests", "fakes", "glows_api.py")
TOKEN = "tok-123"

_spec = importlib.util.spec_from_file_location("glows_api_fake", FAKE_PY)
assert _spec is not None and _spec.loader is not None
glows = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(glows)


def body(key="order.1", **changes):
    data = {"from_image_id": glows.DEFAULT_IMAGE, "gpu_name": "NVIDIA GeForce RTX 4090", "custom_meta_key": key,
            "instance_category": "container", "region_name": "TW-03"}
    data.update(changes)
    return {name: value for name, value in data.items() if value is not None}


class Client:
    def __init__(self, server):
        self.server = server

    def raw(self, method, path, payload=None, headers=None, root=False):
        """(status, content type, bytes); payload: bytes as they are, anything else as JSON."""
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        sent = dict(headers or {})
        data = None
        if payload is not None:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            sent.setdefault("Content-Type", "application/json")
        try:
            conn.request(method, ("" if root else glows.API_PREFIX) + path, body=data, headers=sent)
            response = conn.getresponse()
            return response.status, response.getheader("Content-Type"), response.read()
        finally:
            conn.close()

    def call(self, method, path, payload=None, token=TOKEN, **params):
        headers = {"Authorization": "Bearer " + token} if token is not None else {}
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        status, kind, data = self.raw(method, path + query, payload, headers)
        assert status == 200 and kind == "application/json", (status, data)
        answer = json.loads(data)
        assert isinstance(answer["code"], int) and isinstance(answer["msg"], str)
        return answer

    def create(self, **kwargs):
        return self.call("POST", "/instance", body(**kwargs))

    def faults(self, **faults):
        status, dummy, data = self.raw("POST", "/_fake/faults", faults, root=True)
        assert status == 200
        return json.loads(data)

    def state(self):
        status, dummy, data = self.raw("GET", "/_fake/state", root=True)
        assert status == 200
        return json.loads(data)


@pytest.fixture
def fake(tmp_path):
    with glows.serving(TOKEN, str(tmp_path / "glows.json")) as server:
        yield Client(server)


def test_create_query_list_count_cancel(fake):
    created = fake.create(key="order.1", remark="r", envs="a=b;c=d", cmd="sleep infinity",
                          ports=json.dumps([{"port": 7890, "protocol": 2}]))
    assert created["code"] == 0
    instance = created["instance"]
    assert instance["instanceID"].startswith("ins-") and len(instance["instanceID"]) == 12
    # The docs' create sample: queued, no price, no hardware figures, no urls yet.
    assert instance["status"] == "SchedQueued" and instance["priceCent"] == 0
    assert [access["url"] for access in instance["accesses"]] == ["", ""]
    assert instance["metaKey"] == "order.1" and instance["envs"] == "a=b;c=d" and instance["remark"] == "r"
    assert instance["sourceType"] == "SourceSDK" and instance["regionName"] == "TW-03" and instance["baseSnap"] is None
    assert instance["baseImage"]["imageID"] == glows.DEFAULT_IMAGE and instance["sshCred"]["user"] == "root"

    got = fake.call("GET", "/instance", request_id=instance["instanceID"])["instance"]
    assert got["status"] == "Running" and got["priceCent"] == 65
    assert got["hardware"]["gpuName"] == "NVIDIA GeForce RTX 4090" and got["hardware"]["gpuNum"] == 1
    assert got["hardware"]["gpuRamMB"] == 24564 and got["hardware"]["cpuCoresNum"] >= 1
    assert list(got["hardware"]) == ["gpuName", "cpuName", "gpuNum", "gpuRamMB", "cpuCoresNum", "ramMB", "diskGB"]
    ssh, http_access = got["accesses"]
    assert ssh["protocol"] == "ssh" and ssh["listenPort"] == 22 and ssh["url"].startswith("ssh://127.0.0.1:23")
    assert http_access == {"protocol": "http", "listenPort": 7890, "url": http_access["url"]}
    assert http_access["url"].startswith("http://127.0.0.1:23") and http_access["url"][7:] != ssh["url"][6:]
    assert fake.call("GET", "/instance", meta_key="order.1")["instance"] == got
    # DOC: a legacy hash id (without ins-) is accepted.
    assert fake.call("GET", "/instance", request_id=instance["instanceID"][4:])["instance"] == got

    listed = fake.call("GET", "/instance/list", page=1, per_page=20)
    assert listed["total"] == 1 and listed["instances"] == [got]
    assert fake.call("GET", "/instance/count")["count"] == 1

    assert fake.call("DELETE", "/instance", request_id=instance["instanceID"]) == {"code": 0, "msg": ""}
    assert fake.call("DELETE", "/instance", request_id=instance["instanceID"])["code"] == 10  # cancel twice
    assert fake.call("GET", "/instance", request_id=instance["instanceID"])["code"] == 10
    assert fake.call("GET", "/instance/list") == {"code": 0, "msg": "", "instances": [], "total": 0}
    assert fake.call("GET", "/instance/count")["count"] == 0
    # GUESS: a cancelled instance's key can be used again.
    assert fake.create(key="order.1")["code"] == 0


def test_cancel_by_meta_key_and_passwords_differ(fake):
    first = fake.create(key="a")["instance"]
    second = fake.create(key="b")["instance"]
    assert first["sshCred"]["password"] != second["sshCred"]["password"]
    assert len(first["sshCred"]["password"]) >= 16
    assert fake.call("DELETE", "/instance", meta_key="a")["code"] == 0
    assert [item["metaKey"] for item in fake.call("GET", "/instance/list")["instances"]] == ["b"]


def test_auth(fake):
    assert fake.call("GET", "/instance/count", token="wrong") == {"code": 176, "msg": "token is invalid or expired"}
    assert fake.call("GET", "/instance/count", token=None)["code"] == 176
    assert fake.call("GET", "/instance/count", token=None, Authorization="Bearer " + TOKEN)["code"] == 0
    # The query parameter is copied into the header: the bare token is not a header value.
    assert fake.call("GET", "/instance/count", token=None, Authorization=TOKEN)["code"] == 176
    assert fake.call("POST", "/instance", body(), token="wrong")["code"] == 176
    assert fake.call("GET", "/instance/count")["count"] == 0
    status, dummy, data = fake.raw("GET", "/instance/count", headers={"Authorization": "bearer " + TOKEN})
    assert json.loads(data)["code"] == 176


@pytest.mark.parametrize("changes, code", [
    ({"gpu_name": None}, 7),
    ({"gpu_name": ""}, 7),
    ({"gpu_name": "x" * 129}, 7),
    ({"from_image_id": None}, 7),
    ({"from_snap_id": "snap-x"}, 7),  # both
    ({"from_image_id": "img-nope"}, 7),
    ({"from_image_id": None, "from_snap_id": "snap-nope"}, 7),
    ({"key": "k" * 65}, 17),
    ({"key": None}, 7),
    ({"key": "bad\nkey"}, 7),
    ({"instance_category": "bare-metal"}, 7),
    ({"instance_category": None}, 7),
    ({"region_name": None}, 7),
    ({"ports": "[{\"port\": 7890, \"protocol\": 2}"}, 7),
    ({"ports": [{"port": 7890, "protocol": 2}]}, 7),  # a list, not a JSON string
    ({"ports": "[{\"port\": 70000, \"protocol\": 2}]"}, 7),
    ({"ports": "[{\"port\": 80, \"protocol\": 3}]"}, 7),
    ({"envs": 5}, 7),
])
def test_create_validation(fake, changes, code):
    changes = dict(changes)
    key = changes.pop("key", "order.v")
    answer = fake.call("POST", "/instance", body(key=key, **changes))
    assert answer["code"] == code, answer
    assert "instance" not in answer
    assert fake.call("GET", "/instance/count")["count"] == 0


def test_meta_key_limits_and_odd_characters(fake):
    assert fake.create(key="k" * 64)["code"] == 0
    assert fake.create(key="k" * 64)["code"] == 17
    odd = "order;1 & é'\"/?#"
    assert fake.create(key=odd)["code"] == 0
    assert fake.call("GET", "/instance", meta_key=odd)["instance"]["metaKey"] == odd
    assert fake.call("GET", "/instance", meta_key="bad\nkey")["code"] == 7
    assert fake.call("GET", "/instance", meta_key="k" * 65)["code"] == 7
    assert fake.call("DELETE", "/instance", meta_key=odd)["code"] == 0


def test_query_and_cancel_parameters(fake):
    created = fake.create(key="a")["instance"]
    assert fake.call("GET", "/instance")["code"] == 7
    assert fake.call("GET", "/instance", request_id=created["instanceID"], meta_key="a")["code"] == 7
    assert fake.call("DELETE", "/instance")["code"] == 7
    assert fake.call("GET", "/instance", request_id="ins-nothere")["code"] == 10
    assert fake.call("GET", "/instance", request_id="")["code"] == 7
    dup = "/instance?request_id=%s&request_id=%s" % (created["instanceID"], created["instanceID"])
    status, dummy, data = fake.raw("GET", dup, headers={"Authorization": "Bearer " + TOKEN})
    assert json.loads(data)["code"] == 7


def test_bad_bodies(fake):
    auth = {"Authorization": "Bearer " + TOKEN}
    for payload in (os.urandom(4096), b"", b"[1, 2]", b"\xff\xfe{}", b"null", b'{"a": 1'):
        status, dummy, data = fake.raw("POST", "/instance", payload, auth)
        assert status == 200 and json.loads(data)["code"] == 7, payload
    # 10 MB: read and refused, the client gets the answer (no reset in the middle of its send).
    status, dummy, data = fake.raw("POST", "/instance", b"{" + b" " * (10 << 20) + b"}", auth)
    assert status == 200 and json.loads(data)["code"] == 7
    status, dummy, data = fake.raw("POST", "/instance", None, auth)
    assert json.loads(data)["code"] == 7
    assert fake.call("GET", "/instance/count")["count"] == 0


def test_unknown_paths_and_methods(fake):
    assert fake.raw("GET", "/nothing")[0] == 404
    assert fake.raw("GET", "/nothing", root=True)[0] == 404
    assert fake.raw("PUT", "/instance", {}, {"Authorization": "Bearer " + TOKEN})[0] == 405
    assert fake.raw("DELETE", "/instance/list", None, {"Authorization": "Bearer " + TOKEN})[0] == 405


def test_paging(fake):
    keys = ["order.%02d" % index for index in range(25)]
    for key in keys:
        assert fake.create(key=key)["code"] == 0
    pages = [fake.call("GET", "/instance/list", page=page, per_page=10) for page in (1, 2, 3, 4)]
    assert [len(page["instances"]) for page in pages] == [10, 10, 5, 0]
    assert {page["total"] for page in pages} == {25}
    # Pages are in creation order, with no repeat or gap.
    assert [item["metaKey"] for page in pages for item in page["instances"]] == keys
    assert len(fake.call("GET", "/instance/list")["instances"]) == 20  # default per_page
    assert len(fake.call("GET", "/instance/list", per_page=100)["instances"]) == 25
    for bad in ({"page": 0}, {"per_page": 0}, {"per_page": 101}, {"page": "x"}, {"page": "-1"}, {"page": "1.5"}):
        assert fake.call("GET", "/instance/list", **bad)["code"] == 7, bad
    assert fake.call("GET", "/instance/count")["count"] == 25


def test_same_key_at_once_only_one_wins(fake):
    answers = []
    barrier = threading.Barrier(16)

    def create():
        barrier.wait()
        answers.append(fake.create(key="race")["code"])

    threads = [threading.Thread(target=create) for dummy in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answers) == [0] + [17] * 15
    assert fake.call("GET", "/instance/count")["count"] == 1


def test_cancel_at_once_only_one_succeeds(fake):
    instance_id = fake.create(key="a")["instance"]["instanceID"]
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(fake.call("DELETE", "/instance", request_id=instance_id)
                                                              ["code"])) for dummy in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answers) == [0] + [10] * 7


def test_faults_rate_limit_and_errors(fake):
    assert fake.faults(rate_limit_next=2)["faults"]["rate_limit_next"] == 2
    for dummy in range(2):
        status, kind, data = fake.raw("GET", "/instance/count", headers={"Authorization": "Bearer " + TOKEN})
        assert status == 429 and kind.startswith("text/plain") and data == b"rate limit exceeded"
    assert fake.call("GET", "/instance/count")["code"] == 0
    # The fake's own endpoints are never limited, and answer under the API prefix too.
    fake.faults(error_next={"code": 114, "msg": "busy", "count": 2})
    assert fake.call("GET", "/instance/count") == {"code": 114, "msg": "busy"}
    assert fake.call("POST", "/instance", body()) == {"code": 114, "msg": "busy"}
    assert fake.call("GET", "/instance/count")["count"] == 0
    status, dummy, data = fake.raw("GET", "/_fake/state")
    assert status == 200 and json.loads(data)["instances"] == []
    # A rate limit applies before the token is looked at, as a front proxy would.
    fake.faults(rate_limit_next=1)
    assert fake.raw("GET", "/instance/count", headers={"Authorization": "Bearer wrong"})[0] == 429


def test_fault_validation(fake):
    for bad in ({"nope": 1}, {"rate_limit_next": -1}, {"rate_limit_next": True}, {"schedule_s": "1"},
                {"error_next": {"msg": "no code"}}, {"no_ssh_access": 1}, {"list_fail_page": 0}):
        status, dummy, data = fake.raw("POST", "/_fake/faults", bad, root=True)
        assert json.loads(data)["code"] == 7, bad
    status, dummy, data = fake.raw("POST", "/_fake/faults", b"\x00garbage", root=True)
    assert json.loads(data)["code"] == 7


def test_faults_schedule_price_no_ssh(fake):
    fake.faults(schedule_s=0.6, price_cent=49)
    instance_id = fake.create(key="slow")["instance"]["instanceID"]
    assert fake.call("GET", "/instance", request_id=instance_id)["instance"]["status"] == "SchedQueued"
    time.sleep(0.7)
    running = fake.call("GET", "/instance", request_id=instance_id)["instance"]
    assert running["status"] == "Running" and running["priceCent"] == 49
    fake.faults(schedule_s=0, no_ssh_access=True)
    bare = fake.create(key="bare", ports=json.dumps([{"port": 8888, "protocol": 2}]))["instance"]
    got = fake.call("GET", "/instance", request_id=bare["instanceID"])["instance"]
    assert got["status"] == "Running" and [access["protocol"] for access in got["accesses"]] == ["http"]


def test_fault_list_fail_page(fake):
    for index in range(3):
        fake.create(key="k%d" % index)
    fake.faults(list_fail_page=2)
    assert fake.call("GET", "/instance/list", page=1, per_page=2)["code"] == 0
    assert fake.call("GET", "/instance/list", page=2, per_page=2) == {"code": 1, "msg": "internal error"}
    fake.faults(list_fail_page=None)
    assert len(fake.call("GET", "/instance/list", page=2, per_page=2)["instances"]) == 1
    fake.faults(no_stock=True)
    assert fake.create(key="none")["code"] == 88


def test_state_endpoint_and_file(tmp_path):
    path = tmp_path / "state" / "glows.json"
    server = glows.start(TOKEN, str(path), images={"img-a": None}, snapshots={"snap-b": "/nonexistent"})
    try:
        client = Client(server)
        created = client.call("POST", "/instance", body(key="one", from_image_id="img-a"))["instance"]
        snap = client.call("POST", "/instance", body(key="two", from_image_id=None, from_snap_id="snap-b"))
        assert snap["code"] == 0 and snap["instance"]["baseSnap"] == {"snapID": "snap-b", "snapName": "snap-b"}
        assert snap["instance"]["baseImage"] is None
        state = client.state()
        assert [item["metaKey"] for item in state["instances"]] == ["one", "two"] and state["nodes"] == []
        on_disk = json.loads(path.read_text())
        assert [record["public"]["instanceID"] for record in on_disk["instances"]] == [
            created["instanceID"], snap["instance"]["instanceID"]]
    finally:
        server.stop()
    # A server on the same state file carries on with its instances.
    again = glows.start(TOKEN, str(path), images={"img-a": None}, snapshots={"snap-b": "/nonexistent"})
    try:
        client = Client(again)
        assert client.call("GET", "/instance", meta_key="one")["instance"]["instanceID"] == created["instanceID"]
        assert client.create(key="one", from_image_id="img-a")["code"] == 17
    finally:
        again.stop()
    assert glows.cleanup_state_file(str(path)) == 2
    assert json.loads(path.read_text())["instances"] == []
    assert glows.cleanup_state_file(str(tmp_path / "never-written.json")) == 0


def test_cli_serve_and_cleanup(tmp_path):
    state = str(tmp_path / "glows.json")
    process = subprocess.Popen([sys.executable, FAKE_PY, "serve", "--port", "0", "--token", TOKEN, "--state-file", state,
                                "--price-cent", "70", "--image", "img-x", "--quiet"],
                               stdout=subprocess.PIPE, universal_newlines=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), line
        url = line.split()[-1]
        port = int(urllib.parse.urlsplit(url).port)
        client = Client(type("Bound", (), {"port": port})())
        assert client.create(key="cli", from_image_id="img-x")["code"] == 0
        assert client.call("GET", "/instance", meta_key="cli")["instance"]["priceCent"] == 70
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
    assert len(json.loads(open(state).read())["instances"]) == 1
    done = subprocess.run([sys.executable, FAKE_PY, "cleanup", "--state-file", state], stdout=subprocess.PIPE,
                          universal_newlines=True, check=True)
    assert "cleaned up 1 instance" in done.stdout
    assert json.loads(open(state).read())["instances"] == []


def test_cli_refuses_sandbox_without_root_or_sandbox(tmp_path):
    done = subprocess.run([sys.executable, FAKE_PY, "serve", "--token", TOKEN, "--state-file", str(tmp_path / "s.json"),
                           "--sandbox", "--image", "img-x"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=30, check=False)
    assert done.returncode != 0 and ("needs root" in done.stderr or "not up" in done.stderr or "ID=ROOT" in done.stderr)


def test_each_state_file_has_its_own_access_table(tmp_path):
    """A unit test's cleanup (root, no nodes) must never remove the rules of a sandbox-mode fake serving meanwhile."""
    first, second = glows.access_table(str(tmp_path / "a.json")), glows.access_table(str(tmp_path / "b.json"))
    assert first != second and first.startswith("glows_fake_") and len(first) <= 32
    assert glows.access_table(str(tmp_path / "a.json")) == first


def test_the_state_file_holding_the_passwords_is_its_owners_alone(tmp_path):
    glows.write_json_atomic(str(tmp_path / "state.json"), {"instances": []})
    assert os.stat(tmp_path / "state.json").st_mode & 0o777 == 0o600
