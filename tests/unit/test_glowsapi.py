"""The Glows SDK client (plugins/plugin_utils/glows/api.py) against the fake API (tests/fakes/glows_api.py), every
failure as one line with its fix and never the token; and the pure functions that make hosts of instances
(plugins/plugin_utils/glows/inventory.py)."""

import contextlib
import json
import socket
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible.errors import AnsibleLookupError
from ansible.plugins.loader import lookup_loader

from ansible_collections.prima.cluster.plugins.plugin_utils.glows import inventory as glows_inventory
from ansible_collections.prima.cluster.plugins.plugin_utils.glows.api import (CODE_NOT_FOUND, DEFAULT_API_URL,
                                                                              GlowsClient, GlowsError)
from ansible_collections.prima.cluster.tests.fakes.glows_api import post_faults, serving

TOKEN = "glows-test-token-0123456789"
PASSWORD = "root-password-never-shown"


def instance(meta_key="bench-0", instance_id="ins-aaaaaaaa", status="Running", url="ssh://tw-03.access.glows.ai:23001",
             created=1726810944, **extra):
    value = {
        "instanceID": instance_id, "category": "container", "status": status, "priceCent": 65,
        "hardware": {"gpuName": "NVIDIA GeForce RTX 4090", "cpuName": "Xeon", "gpuNum": 1, "gpuRamMB": 24564,
                     "cpuCoresNum": 10, "ramMB": 43008, "diskGB": 100},
        "baseImage": {"imageID": "img-87p9kq26", "imageName": "Ubuntu20.04 CUDA12.2 Python3.9"}, "baseSnap": None,
        "sshCred": {"user": "root", "password": PASSWORD},
        "accesses": [{"protocol": "http", "listenPort": 8888, "url": "http://tw-03.access.glows.ai:8888"},
                     {"protocol": "ssh", "listenPort": 22, "url": url}],
        "domain": 0, "createTime": {"seconds": created}, "cmd": "", "envs": "", "remark": "prima",
        "metaKey": meta_key, "sourceType": "SourceSDK", "regionName": "TW-03",
    }
    value.update(extra)
    return value


def body(meta_key, **extra):
    value = {"from_image_id": "img-87p9kq26", "gpu_name": "NVIDIA GeForce RTX 4090", "custom_meta_key": meta_key,
             "instance_category": "container", "region_name": "TW-03"}
    value.update(extra)
    return value


# ---- pure functions

def test_ssh_access_is_the_host_and_port_of_the_ssh_url():
    assert glows_inventory.ssh_access(instance()) == ("tw-03.access.glows.ai", 23001)
    two = instance(accesses=[{"protocol": "ssh", "listenPort": 2222, "url": "ssh://a.example:1"},
                             {"protocol": "SSH", "listenPort": 22, "url": "ssh://b.example:2"}])
    assert glows_inventory.ssh_access(two) == ("b.example", 2)  # port 22 inside is the node's sshd
    assert glows_inventory.ssh_access(instance(url="ssh://c.example")) == ("c.example", 22)


@pytest.mark.parametrize("accesses", [[], None, "x", [{"protocol": "ssh", "listenPort": 22, "url": ""}],
                                      [{"protocol": "http", "listenPort": 22, "url": "http://a:1"}]])
def test_no_ssh_access_names_the_instance_and_the_fix(accesses):
    with pytest.raises(GlowsError) as raised:
        glows_inventory.ssh_access(instance(meta_key="k", instance_id="ins-x", accesses=accesses))
    assert str(raised.value) == ("instance ins-x (metaKey k) has no SSH access yet (accesses has no ssh url): wait "
                                 "until it is Running, or create it with port 22 exported")


@pytest.mark.parametrize("url", ["http://a.example:22", "ssh://a.example:99999", "ssh://:22", "nonsense"])
def test_an_ssh_url_of_another_shape_is_refused(url):
    with pytest.raises(GlowsError, match="ins-aaaaaaaa .*not ssh://host:port"):
        glows_inventory.ssh_access(instance(url=url))


def test_host_variables_never_hold_the_password():
    variables = glows_inventory.instance_hostvars(instance())
    assert variables == {
        "ansible_host": "tw-03.access.glows.ai", "ansible_port": 23001, "ansible_user": "root",
        "gpu_name": "NVIDIA GeForce RTX 4090", "gpu_mem": 23.98, "glows_gpu_count": 1, "glows_cpu_cores": 10,
        "glows_ram_gib": 42.0, "glows_disk_gib": 100, "glows_price_cent": 65, "glows_region": "TW-03",
        "glows_image": "Ubuntu20.04 CUDA12.2 Python3.9", "glows_instance_id": "ins-aaaaaaaa",
        "glows_meta_key": "bench-0", "glows_remark": "prima", "glows_status": "Running", "glows_created": 1726810944}
    assert PASSWORD not in json.dumps(variables) and "sshCred" not in json.dumps(variables)


def test_gpu_mem_is_the_vram_of_all_gpus_rounded_down_and_absent_when_unknown():
    two = instance(hardware={"gpuNum": 2, "gpuRamMB": 81920})
    assert glows_inventory.instance_hostvars(two)["gpu_mem"] == 160.0
    queued = instance(hardware={"gpuNum": 0, "gpuRamMB": 0})
    assert "gpu_mem" not in glows_inventory.instance_hostvars(queued)
    odd = instance(hardware="garbage", createTime=None, priceCent="65", sshCred=None)
    variables = glows_inventory.instance_hostvars(odd)
    assert variables["glows_price_cent"] is None and variables["glows_created"] is None
    assert "ansible_user" not in variables and "gpu_mem" not in variables


def test_the_image_is_the_snapshots_name_when_made_from_a_snapshot():
    snap = instance(baseImage=None, baseSnap={"snapID": "6ypgvgpw", "snapName": "prima-built"})
    assert glows_inventory.instance_hostvars(snap)["glows_image"] == "prima-built"


def test_host_name_is_the_meta_key_when_safe_else_the_instance_id():
    assert glows_inventory.host_name(instance(meta_key="bench-7f.a_0")) == "bench-7f.a_0"
    for unsafe in ("order 1", "a/b", "", "-x", None, "ü"):
        assert glows_inventory.host_name(instance(meta_key=unsafe)) == "ins-aaaaaaaa"
    with pytest.raises(GlowsError, match="neither a metaKey nor an instanceID"):
        glows_inventory.host_name(instance(meta_key="a b", instance_id="c d"))


def test_select_applies_every_filter_given():
    many = [instance("b-0", regionName="TW-03"), instance("b-1", status="SchedQueued"),
            instance("b-2", remark="other"), instance("c-0", regionName="TW-04")]

    def keys(chosen):
        return [item["metaKey"] for item in chosen]

    assert keys(glows_inventory.select(many)) == ["b-0", "b-2", "c-0"]
    assert keys(glows_inventory.select(many, statuses=[])) == ["b-0", "b-1", "b-2", "c-0"]
    assert keys(glows_inventory.select(many, meta_key_prefix="b-")) == ["b-0", "b-2"]
    assert keys(glows_inventory.select(many, remark="prima")) == ["b-0", "c-0"]
    assert keys(glows_inventory.select(many, regions=["TW-04"])) == ["c-0"]


def test_rank_order_is_natural_then_creation_then_id():
    many = [instance("x-10", "ins-1"), instance("x-2", "ins-2"), instance("x-1", "ins-3"),
            instance("", "ins-5", created=2), instance("", "ins-4", created=2), instance("", "ins-6", created=1),
            instance("x-1a", "ins-7")]
    assert [(item["metaKey"], item["instanceID"]) for item in glows_inventory.rank_order(many)] == [
        ("", "ins-6"), ("", "ins-4"), ("", "ins-5"), ("x-1", "ins-3"), ("x-1a", "ins-7"), ("x-2", "ins-2"),
        ("x-10", "ins-1")]


def test_the_cache_copy_has_no_password_and_leaves_the_original():
    original = instance()
    stripped = glows_inventory.without_password(original)
    assert stripped["sshCred"] == {"user": "root"} and original["sshCred"]["password"] == PASSWORD
    assert "sshCred" not in glows_inventory.without_password(instance(sshCred="root:" + PASSWORD))


def test_inventory_hosts_fail_whole_on_a_node_without_ssh_or_a_shared_name():
    hosts = glows_inventory.inventory_hosts([instance("b-1", "ins-1"), instance("b-0", "ins-0")])
    assert [host[0] for host in hosts] == ["b-0", "b-1"]
    with pytest.raises(GlowsError, match=r"instance ins-2 \(metaKey b-2\) has no SSH access yet"):
        glows_inventory.inventory_hosts([instance("b-0", "ins-0"), instance("b-2", "ins-2", accesses=[])])
    with pytest.raises(GlowsError, match="both give the host name ins-0"):
        glows_inventory.inventory_hosts([instance("ins-0", "ins-9"), instance("a b", "ins-0")])


# ---- the client against the fake

@pytest.fixture
def fake(tmp_path):
    with serving(token=TOKEN, state_file=str(tmp_path / "glows.json")) as server:
        yield server


def client(url, sleeps=None, **kwargs):
    return GlowsClient(url, TOKEN, sleep=(sleeps.append if sleeps is not None else lambda seconds: None), **kwargs)


def assert_one_line_without_token(error):
    text = str(error)
    assert "\n" not in text and TOKEN not in text and TOKEN not in repr(error)


def test_create_query_find_list_count_cancel(fake):
    glows = client(fake.url)
    assert TOKEN not in repr(glows)
    made = [glows.create(body("bench-%d" % index)) for index in range(5)]
    assert all(item["metaKey"] == "bench-%d" % index for index, item in enumerate(made))
    assert glows.query(request_id=made[0]["instanceID"])["metaKey"] == "bench-0"
    assert glows.query(meta_key="bench-1")["instanceID"] == made[1]["instanceID"]
    assert glows.find("bench-2")["instanceID"] == made[2]["instanceID"]
    listed = glows.list_all(per_page=2)  # three pages
    assert sorted(item["metaKey"] for item in listed) == ["bench-%d" % index for index in range(5)]
    assert glows.count() == 5
    glows.cancel(meta_key="bench-4")
    glows.cancel(request_id=made[3]["instanceID"])
    assert glows.find("bench-4") is None and glows.count() == 3
    with pytest.raises(GlowsError) as raised:
        glows.query(meta_key="bench-4")
    assert raised.value.code == CODE_NOT_FOUND and "no such Glows instance" in str(raised.value)
    with pytest.raises(GlowsError) as raised:
        glows.cancel(meta_key="bench-4")
    assert raised.value.code == CODE_NOT_FOUND
    with pytest.raises(GlowsError, match="exactly one of request_id and meta_key"):
        glows.query()


def test_a_bad_token_is_code_176_and_says_where_to_set_it(fake):
    with pytest.raises(GlowsError) as raised:
        GlowsClient(fake.url, "not-" + TOKEN).count()
    assert str(raised.value).startswith("the Glows API refused the token (code 176 at GET %s/instance/count"
                                        % fake.url)
    assert str(raised.value).endswith(": set GLOWS_SDK_TOKEN or the inventory's token to a valid SDK token")
    assert "not-" + TOKEN not in str(raised.value)


def test_a_missing_or_unusable_token_or_url_fails_before_any_call():
    for token in ("", "  ", "two words", "tab\there"):
        with pytest.raises(GlowsError, match="GLOWS_SDK_TOKEN"):
            GlowsClient(DEFAULT_API_URL, token)
    with pytest.raises(GlowsError, match="not an http"):
        GlowsClient("ftp://a.glows.ai", TOKEN)


def test_a_non_zero_code_names_code_message_and_endpoint(fake):
    post_faults(fake, error_next={"code": 88, "msg": "no stock of\nthat GPU " + TOKEN, "count": 1})
    with pytest.raises(GlowsError) as raised:
        client(fake.url).create(body("bench-0"))
    assert str(raised.value).startswith("POST %s/instance answered code 88 (no stock of that GPU <token>)" % fake.url)
    assert raised.value.code == 88
    assert_one_line_without_token(raised.value)


def test_rate_limits_are_retried_with_exponential_backoff(fake):
    post_faults(fake, rate_limit_next=3)
    sleeps = []
    assert client(fake.url, sleeps, retries=5, backoff_s=0.5).count() == 0
    assert sleeps == [0.5, 1.0, 2.0]


def test_rate_limits_past_the_retries_say_how_long_was_waited(fake):
    post_faults(fake, rate_limit_next=10)
    sleeps = []
    with pytest.raises(GlowsError) as raised:
        client(fake.url, sleeps, retries=2).list_all()
    assert str(raised.value) == ("rate limited by GET %s/instance/list?page=1&per_page=50 after 3 tries over 3.0 s; "
                                 "wait and re-run" % fake.url)
    assert sleeps == [1.0, 2.0] and raised.value.status == 429


def test_an_unreachable_api_names_the_url_to_check():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(GlowsError) as raised:
        client("http://127.0.0.1:%d/sdk/v1" % port).count()
    assert str(raised.value).startswith("cannot reach the Glows API at http://127.0.0.1:%d/sdk/v1: " % port)
    assert str(raised.value).endswith("; check api_url / GLOWS_API_URL")
    assert_one_line_without_token(raised.value)


def test_a_failed_listing_page_fails_the_whole_listing(fake):
    glows = client(fake.url)
    for index in range(3):
        glows.create(body("bench-%d" % index))
    post_faults(fake, list_fail_page=2)
    with pytest.raises(GlowsError) as raised:
        glows.list_all(per_page=2)
    assert str(raised.value).startswith("GET %s/instance/list?page=2&per_page=2 answered code 1 (internal error)"
                                        % fake.url)


def test_a_new_instance_without_ssh_access_is_named(fake):
    post_faults(fake, no_ssh_access=True)
    made = client(fake.url).create(body("bench-0"))
    with pytest.raises(GlowsError) as raised:
        glows_inventory.inventory_hosts(client(fake.url).list_all())
    assert str(raised.value).startswith("instance %s (metaKey bench-0) has no SSH access yet" % made["instanceID"])


def test_the_ssh_password_lookup_reads_it_fresh(fake):
    made = client(fake.url).create(body("bench-0"))
    lookup = lookup_loader.get("prima.cluster.glows_ssh_password")
    assert lookup.run([made["instanceID"]], variables={}, api_url=fake.url, token=TOKEN) == [
        made["sshCred"]["password"]]
    with pytest.raises(AnsibleLookupError) as raised:
        lookup.run(["ins-missing"], variables={}, api_url=fake.url, token=TOKEN)
    assert "no such Glows instance" in str(raised.value) and TOKEN not in str(raised.value)


# ---- answers the fake never gives: a small server per test

@contextlib.contextmanager
def answering(respond):
    """A server whose every GET is answered by respond(handler)."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802 - http.server's naming
            respond(self)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield "http://127.0.0.1:%d/sdk/v1" % httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


def send(handler, status, payload, headers=()):
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    handler.send_response(status)
    for name, value in headers:
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def test_an_answer_that_is_not_json_is_refused():
    with answering(lambda handler: send(handler, 200, b"<html>login</html>")) as url:
        with pytest.raises(GlowsError) as raised:
            client(url).count()
    assert str(raised.value).startswith("GET %s/instance/count answered HTTP 200 with something that is not JSON "
                                        "('<html>login</html>'): check api_url / GLOWS_API_URL" % url)


def test_json_of_another_shape_is_refused():
    for payload in ([1, 2], {"msg": "no code"}, {"code": True}):
        with answering(lambda handler: send(handler, 200, payload)) as url:
            with pytest.raises(GlowsError, match="JSON that is not the SDK's"):
                client(url).count()
    with answering(lambda handler: send(handler, 200, {"code": 0, "msg": "", "count": "3"})) as url:
        with pytest.raises(GlowsError, match="not a count"):
            client(url).count()


def test_http_401_is_a_refused_token():
    with answering(lambda handler: send(handler, 401, b"unauthorized")) as url:
        with pytest.raises(GlowsError, match=r"^the Glows API refused the token \(HTTP 401 .*valid SDK token$"):
            client(url).count()


def test_a_redirect_to_another_host_is_refused_and_the_token_stays_home():
    seen = []

    def elsewhere(handler):
        seen.append(handler.headers.get("Authorization"))
        send(handler, 200, {"code": 0, "msg": "", "count": 1})

    with answering(elsewhere) as other:
        target = other.replace("127.0.0.1", "localhost")
        with answering(lambda handler: send(handler, 302, b"", [("Location", target + "/instance/count")])) as url:
            with pytest.raises(GlowsError) as raised:
                client(url).count()
    assert "redirected to another host" in str(raised.value) and "refused so the token is not sent there" in str(
        raised.value)
    assert seen == []


def test_a_listing_shorter_than_its_total_is_refused():
    def short(handler):
        page = 1 if "page=1&" in handler.path else 2
        items = [{"instanceID": "ins-%d" % page}] if page == 1 else []
        send(handler, 200, {"code": 0, "msg": "", "instances": items, "total": 3})

    with answering(short) as url:
        with pytest.raises(GlowsError, match="gave 1 instances but announced 3"):
            client(url).list_all(per_page=1)


def test_an_oversized_answer_is_refused(monkeypatch):
    from ansible_collections.prima.cluster.plugins.plugin_utils.glows import api as glows_api
    monkeypatch.setattr(glows_api, "MAX_BODY_BYTES", 1024)
    with answering(lambda handler: send(handler, 200, b"x" * 4096)) as url:
        with pytest.raises(GlowsError, match="answered more than"):
            client(url).count()


def trickling(handler, status=200):
    """An answer that keeps coming, one byte every 0.1 s for 3 s: each read is quick, the whole is not."""
    try:
        handler.send_response(status)
        handler.send_header("Content-Length", "30")
        handler.end_headers()
        for _sent in range(30):
            handler.wfile.write(b" ")
            handler.wfile.flush()
            time.sleep(0.1)
    except OSError:
        pass  # the client hung up, as it should


@pytest.mark.parametrize("status", [200, 500])
def test_a_trickled_answer_is_cut_off_at_timeout_s_in_all(status):
    # 500: the body of an HTTP error is read too (the API sends its envelope with it), under the same deadline.
    with answering(lambda handler: trickling(handler, status)) as url:
        started = time.monotonic()
        with pytest.raises(GlowsError) as raised:
            client(url, timeout_s=0.5).count()
        took = time.monotonic() - started
    assert took < 1.5, "one call took %.1f s with timeout_s=0.5" % took
    assert str(raised.value) == ("GET %s/instance/count gave no complete answer within 0.5 s (timeout_s, for "
                                 "connecting and reading it all); re-run later, raise timeout_s, or check api_url / "
                                 "GLOWS_API_URL" % url)
    assert_one_line_without_token(raised.value)


def test_the_ssh_password_lookup_passes_its_timeout_on():
    lookup = lookup_loader.get("prima.cluster.glows_ssh_password")
    with answering(trickling) as url:
        started = time.monotonic()
        with pytest.raises(AnsibleLookupError, match="no complete answer within 0.5 s"):
            lookup.run(["ins-aaaaaaaa"], variables={}, api_url=url, token=TOKEN, timeout_s=0.5)
    assert time.monotonic() - started < 1.5


def test_the_token_is_scrubbed_anywhere_and_url_encoded_before_any_shortening():
    token = "sk/live+9f8e=7d6c.5b4a"
    forms = (token, urllib.parse.quote(token), urllib.parse.quote(token, safe=""), urllib.parse.quote_plus(token))
    messages = ["invalid token %s." % token, "rejected Authorization=Bearer%%20%s" % urllib.parse.quote(token),
                "token=%s&x=1" % urllib.parse.quote_plus(token), "k=%s" % urllib.parse.quote(token, safe=""),
                "x" * 190 + " " + token]
    # A body that is not JSON is quoted only in part: the token must not be cut into the excerpt either.
    answers = [(200, {"code": 5, "msg": message}) for message in messages] + [
        (502, ("<html>" + "x" * 66 + token).encode())]
    with answering(lambda handler: send(handler, *answers[0])) as url:  # one server: each stop takes 0.5 s
        while answers:
            with pytest.raises(GlowsError) as raised:
                GlowsClient(url, token).count()
            answers.pop(0)
            text = str(raised.value)
            assert "<token>" in text and not any(form[:4] in text for form in forms), text


def raw_answer(data):
    """A responder that writes these bytes as the whole answer, HTTP or not."""
    def respond(handler):
        handler.close_connection = True
        handler.wfile.write(data)
    return respond


def http_200(body):
    return b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body


BROKEN_ANSWERS = {
    "nested far past the recursion limit": (http_200(b"[" * 100000 + b"]" * 100000), "nested deeper"),
    "a deep value in the envelope": (http_200(b'{"code":0,"msg":"","count":' + b"[" * 100000 + b"]" * 100000 + b"}"),
                                     "nested deeper"),
    "deep, but within the recursion limit": (http_200(b'{"code":0,"msg":' + b"[" * 900 + b"]" * 900 + b"}"),
                                             "nested more than 64 levels"),
    "not a status line": (b"garbage\r\n\r\n", "not HTTP (BadStatusLine"),
    "a header line too long": (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000 + b"\r\n\r\n", "not HTTP (LineTooLong"),
    "too many headers": (b"HTTP/1.1 200 OK\r\n" + b"X: a\r\n" * 200 + b"\r\n", "not HTTP (HTTPException"),
    "a broken chunk": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "not HTTP (IncompleteRead"),
}


@pytest.mark.parametrize("name", sorted(BROKEN_ANSWERS))
def test_every_failure_of_a_call_is_a_one_line_glows_error(name):
    """Deep JSON raised RecursionError, and http.client's own errors are no OSError: both escaped as themselves."""
    data, needle = BROKEN_ANSWERS[name]
    with answering(raw_answer(data)) as url:
        for call in (lambda glows: glows.count(), lambda glows: glows.list_all(),
                     lambda glows: glows.query(request_id="ins-x"), lambda glows: glows.find("k-0")):
            try:
                call(client(url, retries=0, timeout_s=5))
            except GlowsError as error:
                assert needle in str(error) and "/sdk/v1/instance" in str(error), (name, str(error))
                assert_one_line_without_token(error)
            else:
                raise AssertionError("%s: no error" % name)
