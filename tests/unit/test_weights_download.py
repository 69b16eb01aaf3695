"""The resumable verified download against real HTTP servers on loopback: the sandbox hub, and servers that lie."""

import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.prima.cluster.plugins.module_utils.weights_download import (
    LOCK_SUFFIX, META_SUFFIX, PARTIAL_SUFFIX, STAMP_SUFFIX, DownloadError, HubRedirectHandler, download_verified,
    verify_only)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAYLOAD = bytes(range(256)) * 4096 + b"tail"  # 1 MiB + 4 bytes
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()
SIZE = len(PAYLOAD)


def load_hub_server():
    spec = importlib.util.spec_from_file_location("hub_server", os.path.join(REPO, "roles/sandbox/files/hub_server.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hub_server = load_hub_server()


def serve(server):
    # A short poll: server.shutdown() waits for the loop to look (0.5 s by default, at each test's end).
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return "http://127.0.0.1:%d" % server.server_address[1]


@pytest.fixture
def hub(tmp_path):
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "model.gguf").write_bytes(PAYLOAD)
    hub_server.publish(str(tmp_path / "hub" / "org" / "repo"), str(staging))
    log = tmp_path / "hub.log"
    server = hub_server.HubServer(str(tmp_path / "hub"), "127.0.0.1", 0, str(log))
    base = serve(server)
    yield base + "/org/repo/resolve/main/model.gguf", tmp_path / "hub" / "org" / "repo", log
    server.shutdown()
    server.server_close()


class Scripted(BaseHTTPRequestHandler):
    """Answers each GET with the server's next scripted reply; records the request headers."""

    protocol_version = "HTTP/1.0"

    def do_GET(self):
        self.server.requests.append(dict(self.headers))
        reply = self.server.replies.pop(0) if self.server.replies else self.server.replies_default
        status, headers, body = reply(self)
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, format, *args):  # noqa: A002
        pass


@pytest.fixture
def scripted():
    servers = []

    def make(*replies, default=None):
        server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
        server.daemon_threads = True
        server.requests, server.replies = [], list(replies)
        server.replies_default = default or (lambda handler: (500, {}, b""))
        servers.append(server)
        return server, serve(server)

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()


def full(etag='"v1"'):
    return lambda handler: (200, {"Content-Length": str(SIZE), "ETag": etag}, PAYLOAD)


def ranged(etag='"v1"', start_shift=0):
    def reply(handler):
        first = int(handler.headers["Range"].split("=")[1].rstrip("-")) + start_shift
        return 206, {"Content-Length": str(SIZE - first), "Content-Range": "bytes %d-%d/%d" % (first, SIZE - 1, SIZE),
                     "ETag": etag}, PAYLOAD[first:]
    return reply


def cut_after(count, etag='"v1"'):
    return lambda handler: (200, {"Content-Length": str(SIZE), "ETag": etag}, PAYLOAD[:count])


def served(log, count=1):
    """The hub's log, once it holds `count` records (it writes each after the response)."""
    deadline = time.monotonic() + 5
    records = []
    while time.monotonic() < deadline:
        records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        if len(records) >= count:
            break
        time.sleep(0.02)
    return records


def leftovers(directory):
    return sorted(name for name in os.listdir(str(directory)) if name != "model.gguf" + LOCK_SUFFIX)


def test_cold_download_through_the_redirect_then_stamp(hub, tmp_path):
    url, dummy, log = hub
    dest = str(tmp_path / "models" / "model.gguf")
    progress = str(tmp_path / "progress.json")
    first = download_verified(url, dest, DIGEST, progress_path=progress, expected_size=SIZE)
    assert first["changed"] and first["verified_by"] == "download" and first["sha256"] == DIGEST
    assert first["downloaded_bytes"] == SIZE and first["resumed_from"] == 0
    with open(dest, "rb") as handle:
        assert handle.read() == PAYLOAD
    assert leftovers(tmp_path / "models") == ["model.gguf", "model.gguf" + STAMP_SUFFIX]
    assert json.load(open(progress))["state"] == "done"
    second = download_verified(url, dest, DIGEST, expected_size=SIZE)
    assert not second["changed"] and second["verified_by"] == "stamp" and second["downloaded_bytes"] == 0
    assert [record["status"] for record in served(log, 2)] == [302, 200]


def test_interrupted_download_resumes_with_if_range(scripted, tmp_path):
    server, base = scripted(cut_after(300000), ranged())
    dest = str(tmp_path / "model.gguf")
    with pytest.raises(DownloadError, match="gave up after 1 attempts"):
        download_verified(base + "/m", dest, DIGEST, retries=0, expected_size=SIZE)
    assert os.path.getsize(dest + PARTIAL_SUFFIX) == 300000
    result = download_verified(base + "/m", dest, DIGEST, expected_size=SIZE)
    assert result["resumed_from"] == 300000 and result["downloaded_bytes"] == SIZE - 300000
    assert server.requests[1]["Range"] == "bytes=300000-" and server.requests[1]["If-Range"] == '"v1"'
    assert open(dest, "rb").read() == PAYLOAD and leftovers(tmp_path) == ["model.gguf", "model.gguf.verified"]


def test_file_changed_upstream_is_not_spliced(hub, tmp_path):
    """The partial file came from other bytes (another ETag): the hub answers If-Range with the whole file."""
    url, dummy, log = hub
    dest = str(tmp_path / "model.gguf")
    with open(dest + PARTIAL_SUFFIX, "wb") as handle:
        handle.write(b"old bytes of the file before it changed" * 1000)
    with open(dest + PARTIAL_SUFFIX + META_SUFFIX, "w") as handle:
        json.dump({"url": url, "sha256": DIGEST, "size": SIZE, "validator": '"an-older-etag"'}, handle)
    result = download_verified(url, dest, DIGEST, expected_size=SIZE)
    assert result["resumed_from"] == 0 and result["downloaded_bytes"] == SIZE
    assert served(log, 2)[1]["status"] == 200


def test_partial_of_another_digest_is_never_resumed(scripted, tmp_path):
    server, base = scripted(full())
    dest = str(tmp_path / "model.gguf")
    with open(dest + PARTIAL_SUFFIX, "wb") as handle:
        handle.write(PAYLOAD[:1000])
    with open(dest + PARTIAL_SUFFIX + META_SUFFIX, "w") as handle:
        json.dump({"url": base + "/m", "sha256": "0" * 64, "size": SIZE, "validator": '"v1"'}, handle)
    download_verified(base + "/m", dest, DIGEST, expected_size=SIZE)
    assert "Range" not in server.requests[0]


def test_206_from_another_offset_is_refused(scripted, tmp_path):
    server, base = scripted(cut_after(300000), ranged(start_shift=-1000))
    dest = str(tmp_path / "model.gguf")
    with pytest.raises(DownloadError):
        download_verified(base + "/m", dest, DIGEST, retries=0, expected_size=SIZE)
    with pytest.raises(DownloadError, match="answered bytes from 299000 to a request for bytes from 300000"):
        download_verified(base + "/m", dest, DIGEST, retries=0, expected_size=SIZE)
    assert not os.path.exists(dest) and not os.path.exists(dest + PARTIAL_SUFFIX)


def test_200_to_a_range_restarts_from_zero(scripted, tmp_path):
    server, base = scripted(cut_after(300000), full())
    dest = str(tmp_path / "model.gguf")
    with pytest.raises(DownloadError):
        download_verified(base + "/m", dest, DIGEST, retries=0, expected_size=SIZE)
    result = download_verified(base + "/m", dest, DIGEST, expected_size=SIZE)
    assert result["resumed_from"] == 0 and open(dest, "rb").read() == PAYLOAD


@pytest.mark.parametrize("reply, message", [
    (lambda handler: (200, {}, PAYLOAD[:5000]), "gave up after 1 attempts; last error: connection closed after 5000"),
    (lambda handler: (200, {"Content-Length": "100"}, PAYLOAD[:100]), "says the file has 100 bytes, 1048580 expected"),
    (lambda handler: (200, {}, PAYLOAD + b"x" * 10), "sent more than the 1048580 bytes expected"),
    (lambda handler: (200, {"Content-Length": "12abc"}, PAYLOAD), "answered Content-Length '12abc', which is not"),
    (lambda handler: (200, {"Content-Length": "-5"}, PAYLOAD), "answered Content-Length '-5'"),
])
def test_a_lying_server_never_gets_a_file_installed(scripted, tmp_path, reply, message):
    """Without a digest to check (a file without LFS, before the lock pins it), the size still must match."""
    server, base = scripted(reply)
    dest = str(tmp_path / "model.gguf")
    with pytest.raises(DownloadError, match=message) as failure:
        download_verified(base + "/m", dest, None, retries=0, expected_size=SIZE)
    assert base + "/m" in str(failure.value)
    assert not os.path.exists(dest)


@pytest.mark.parametrize("content_range", ["bytes 300000-/1048580", "bytes x-y/z", "bytes 300000-1048579/-1",
                                           "bytes 300000-2/1048580"])
def test_malformed_content_range_names_the_url(scripted, tmp_path, content_range):
    server, base = scripted(cut_after(300000), lambda handler: (206, {"Content-Range": content_range, "ETag": '"v1"'},
                                                                b"x"))
    dest = str(tmp_path / "model.gguf")
    with pytest.raises(DownloadError):
        download_verified(base + "/m", dest, DIGEST, retries=0, expected_size=SIZE)
    with pytest.raises(DownloadError, match="%s/m answered 206 with Content-Range" % base):
        download_verified(base + "/m", dest, DIGEST, retries=0, expected_size=SIZE)


def test_empty_file_at_the_destination_is_not_taken(hub, tmp_path):
    url, dummy, dummy = hub
    dest = str(tmp_path / "model.gguf")
    open(dest, "wb").close()
    assert verify_only(dest, None)["verified"] is False
    result = download_verified(url, dest, None, expected_size=SIZE)
    assert result["replaced_corrupt"] and result["sha256"] == DIGEST


def test_flipped_byte_is_detected_and_fetched_again(hub, tmp_path):
    url, dummy, dummy = hub
    dest = str(tmp_path / "model.gguf")
    download_verified(url, dest, DIGEST, expected_size=SIZE)
    with open(dest, "r+b") as handle:
        handle.seek(1000)
        byte = handle.read(1)
        handle.seek(1000)
        handle.write(bytes([byte[0] ^ 0xFF]))
    result = download_verified(url, dest, DIGEST, expected_size=SIZE)
    assert result["replaced_corrupt"] and result["verified_by"] == "download"
    assert open(dest, "rb").read() == PAYLOAD


def test_wrong_bytes_fail_and_leave_nothing_under_the_final_name(hub, tmp_path):
    url, repo, dummy = hub
    [commit] = os.listdir(str(repo / "commits"))
    (repo / "commits" / commit / "model.gguf").write_bytes(PAYLOAD[:-1] + b"X")
    dest = str(tmp_path / "models" / "model.gguf")
    with pytest.raises(DownloadError, match="sha256 of the downloaded model.gguf is .* expected %s .from the hub."
                                            % DIGEST):
        download_verified(url, dest, DIGEST, expected_size=SIZE, digest_source="hub")
    assert leftovers(tmp_path / "models") == []


def test_missing_file_fails_at_once_naming_the_catalog(hub, tmp_path):
    url, dummy, log = hub
    with pytest.raises(DownloadError, match="404: check the repository, revision and file name"):
        download_verified(url.replace("model.gguf", "nope.gguf"), str(tmp_path / "nope.gguf"), retries=3)
    assert len(served(log)) == 1


def test_unreachable_server_keeps_partial_and_says_so(tmp_path):
    dest = str(tmp_path / "model.gguf")
    url = "http://127.0.0.1:9/x"
    with open(dest + PARTIAL_SUFFIX, "wb") as handle:
        handle.write(b"abc")
    with open(dest + PARTIAL_SUFFIX + META_SUFFIX, "w") as handle:
        json.dump({"url": url, "sha256": DIGEST, "size": None, "validator": '"v1"'}, handle)
    with pytest.raises(DownloadError, match="gave up after 2 attempts.*next run resumes it"):
        download_verified(url, dest, DIGEST, retries=1, timeout=2, retry_delay=0.01)
    assert os.path.getsize(dest + PARTIAL_SUFFIX) == 3 and not os.path.exists(dest)


def test_token_goes_to_the_hub_host_only(scripted, tmp_path):
    cdn, cdn_base = scripted(full())
    hub_, hub_base = scripted(lambda handler: (302, {"Location": hub_base + "/same-host"}, b""),
                              lambda handler: (302, {"Location": cdn_base + "/lfs"}, b""))
    download_verified(hub_base + "/m", str(tmp_path / "model.gguf"), DIGEST, token="s3cret", expected_size=SIZE)
    assert [request.get("Authorization") for request in hub_.requests] == ["Bearer s3cret"] * 2
    assert "Authorization" not in cdn.requests[0]


def test_https_to_http_redirect_is_refused():
    handler = HubRedirectHandler("https://hub.example/m", "s3cret")
    request = urllib.request.Request("https://hub.example/org/repo/resolve/main/m.gguf")
    with pytest.raises(DownloadError, match="from https down to http: refused"):
        handler.redirect_request(request, None, 302, "Found", {}, "http://cdn.example/m.gguf")
    same = handler.redirect_request(request, None, 302, "Found", {}, "https://hub.example/other/m.gguf")
    assert same.unredirected_hdrs["Authorization"] == "Bearer s3cret"
    other = handler.redirect_request(request, None, 302, "Found", {}, "https://cdn.example/m.gguf")
    assert "Authorization" not in other.unredirected_hdrs and "Authorization" not in other.headers


def test_second_downloader_waits_for_the_first_and_never_writes_the_final_file(scripted, tmp_path):
    def slow(handler):
        time.sleep(1.5)
        return full()(handler)

    server, base = scripted(slow, default=full())
    dest = str(tmp_path / "model.gguf")
    results = {}
    first = threading.Thread(target=lambda: results.update(first=download_verified(base + "/m", dest, DIGEST,
                                                                                   expected_size=SIZE)))
    first.start()
    time.sleep(0.3)
    progress = str(tmp_path / "second.json")
    results["second"] = download_verified(base + "/m", dest, DIGEST, expected_size=SIZE, progress_path=progress)
    first.join()
    assert results["first"]["verified_by"] == "download"
    assert results["second"]["verified_by"] == "stamp" and results["second"]["downloaded_bytes"] == 0
    assert len(server.requests) == 1 and open(dest, "rb").read() == PAYLOAD


def test_a_dead_holder_is_taken_over(scripted, tmp_path):
    server, base = scripted(full())
    dest = str(tmp_path / "model.gguf")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
                               dest + LOCK_SUFFIX], stdout=subprocess.PIPE)
    assert holder.stdout.readline() == b"held\n"
    threading.Timer(0.5, lambda: holder.send_signal(signal.SIGKILL)).start()
    result = download_verified(base + "/m", dest, DIGEST, expected_size=SIZE)
    holder.wait()
    assert result["verified_by"] == "download" and open(dest, "rb").read() == PAYLOAD


def test_progress_line_reads_like_a_person_would_say_it():
    from ansible_collections.prima.cluster.plugins.action.models_wait import describe_progress

    line = describe_progress("n0", {"file": "m.gguf", "state": "downloading", "bytes": 512 << 20,
                                    "total": 2048 << 20, "rate_bytes_s": 85_000_000, "elapsed_s": 6.3})
    assert line == "n0: m.gguf downloading 512.0 MiB of 2048.0 MiB (25.0%) at 85.0 MB/s after 6.3s"


def test_progress_file_is_rate_limited(tmp_path):
    from ansible_collections.prima.cluster.plugins.module_utils.weights_download import Progress

    now = [0.0]
    progress = Progress(str(tmp_path / "p.json"), "m.gguf", interval=5, clock=lambda: now[0])
    progress.update("downloading", 10, 100)
    now[0] = 1.0
    progress.update("downloading", 20, 100)
    assert json.load(open(str(tmp_path / "p.json")))["bytes"] == 10
    now[0] = 6.0
    progress.update("downloading", 60, 100)
    assert json.load(open(str(tmp_path / "p.json")))["percent"] == 60.0


# The hostile review's findings, each kept as the test that found it.

OTHER = bytes(reversed(PAYLOAD))


def ranged_other(etag):
    def reply(handler):
        first = int(handler.headers["Range"].split("=")[1].rstrip("-"))
        return 206, {"Content-Length": str(SIZE - first), "ETag": etag,
                     "Content-Range": "bytes %d-%d/%d" % (first, SIZE - 1, SIZE)}, OTHER[first:]
    return reply


def other_full(etag='"v2"'):
    return lambda handler: (200, {"Content-Length": str(SIZE), "ETag": etag}, OTHER)


def test_a_dangling_link_at_the_partial_file_is_not_followed(scripted, tmp_path):
    server, base = scripted(full())
    models, outside = tmp_path / "models", tmp_path / "outside"
    models.mkdir()
    dest = str(models / "model.gguf")
    os.symlink(str(outside), dest + PARTIAL_SUFFIX)
    download_verified(base + "/m", dest, DIGEST, expected_size=SIZE)
    assert not outside.exists() and not os.path.islink(dest) and open(dest, "rb").read() == PAYLOAD


def test_a_link_at_the_lock_file_leaves_its_target_alone(scripted, tmp_path):
    server, base = scripted(full())
    victim = tmp_path / "victim.conf"
    victim.write_text("important\n")
    (tmp_path / "models").mkdir()
    dest = str(tmp_path / "models" / "model.gguf")
    os.symlink(str(victim), dest + LOCK_SUFFIX)
    download_verified(base + "/m", dest, DIGEST, expected_size=SIZE)
    assert victim.read_text() == "important\n"


def test_a_206_of_another_version_is_not_spliced_without_a_digest(scripted, tmp_path):
    """The server ignored If-Range: its 206 carries another ETag. The download starts over instead."""
    server, base = scripted(cut_after(300000, '"v1"'), ranged_other('"v2"'), other_full())
    dest = str(tmp_path / "model.gguf")
    with pytest.raises(DownloadError):
        download_verified(base + "/m", dest, None, retries=0, expected_size=SIZE)
    download_verified(base + "/m", dest, None, expected_size=SIZE, retry_delay=0.01)
    assert open(dest, "rb").read() == OTHER


def test_without_a_strong_etag_nothing_is_resumed(scripted, tmp_path):
    server, base = scripted(cut_after(300000, 'W/"v1"'), other_full('W/"v2"'))
    dest = str(tmp_path / "model.gguf")
    with pytest.raises(DownloadError):
        download_verified(base + "/m", dest, None, retries=0, expected_size=SIZE)
    download_verified(base + "/m", dest, None, expected_size=SIZE)
    assert "Range" not in server.requests[1] and open(dest, "rb").read() == OTHER


def test_a_kill_after_a_changed_file_is_not_resumed_as_the_new_version(scripted, tmp_path, monkeypatch):
    """A 200 (the file changed) must not record the new ETag over the old bytes before they are cut off."""
    from ansible_collections.prima.cluster.plugins.module_utils import weights_download

    server, base = scripted(cut_after(300000, '"v1"'), other_full(), default=other_full())
    dest = str(tmp_path / "model.gguf")
    with pytest.raises(DownloadError):
        download_verified(base + "/m", dest, None, retries=0, expected_size=SIZE)

    class Killed(BaseException):
        pass

    def die(*args, **kwargs):
        raise Killed()  # the process dies here (SIGKILL, OOM, a reboot)

    monkeypatch.setattr(weights_download, "open_new", die)
    with pytest.raises(Killed):
        download_verified(base + "/m", dest, None, retries=0, expected_size=SIZE)
    monkeypatch.undo()
    download_verified(base + "/m", dest, None, expected_size=SIZE)
    assert open(dest, "rb").read() == OTHER


@pytest.mark.parametrize("content", ["[1]", '"x"', "3.5", "[" * 100000])
def test_a_stamp_of_another_shape_is_no_stamp(hub, tmp_path, content):
    url, dummy, dummy = hub
    dest = str(tmp_path / "model.gguf")
    open(dest, "wb").write(PAYLOAD)
    open(dest + STAMP_SUFFIX, "w").write(content)
    assert verify_only(dest, DIGEST)["verified_by"] == "hash"
    assert download_verified(url, dest, DIGEST, expected_size=SIZE)["verified_by"] == "hash"


@pytest.mark.parametrize("validator", ['"v1"\nX-Evil: 1', ["v1"], 7])
def test_a_partial_record_of_another_shape_starts_over(scripted, tmp_path, validator):
    server, base = scripted(full())
    dest = str(tmp_path / "model.gguf")
    open(dest + PARTIAL_SUFFIX, "wb").write(PAYLOAD[:1000])
    with open(dest + PARTIAL_SUFFIX + META_SUFFIX, "w") as handle:
        json.dump({"url": base + "/m", "sha256": DIGEST, "size": SIZE, "validator": validator}, handle)
    download_verified(base + "/m", dest, DIGEST, expected_size=SIZE)
    assert "Range" not in server.requests[0] and open(dest, "rb").read() == PAYLOAD


def test_a_directory_at_the_destination_is_named(scripted, tmp_path):
    server, base = scripted(full())
    dest = tmp_path / "model.gguf"
    dest.mkdir()
    assert verify_only(str(dest), DIGEST)["verified"] is False
    with pytest.raises(DownloadError, match="%s is a directory" % dest):
        download_verified(base + "/m", str(dest), DIGEST, expected_size=SIZE)


def test_same_size_bytes_found_there_are_not_taken_without_a_digest(scripted, tmp_path):
    server, base = scripted(full())
    dest = str(tmp_path / "model.gguf")
    open(dest, "wb").write(bytes(SIZE))
    result = download_verified(base + "/m", dest, None, expected_size=SIZE)
    assert result["replaced_corrupt"] and result["sha256"] == DIGEST


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/a b.gguf", "nope://x/m.gguf"])
def test_an_unusable_url_fails_at_once(url, tmp_path):
    started = time.monotonic()
    with pytest.raises(DownloadError, match="cannot be fetched"):
        download_verified(url, str(tmp_path / "m.gguf"), DIGEST, retries=3, retry_delay=1)
    assert time.monotonic() - started < 1


def test_a_redirect_to_another_scheme_is_refused():
    handler = HubRedirectHandler("http://hub.example/m", None)
    request = urllib.request.Request("http://hub.example/m.gguf")
    with pytest.raises(DownloadError, match="only http and https are followed"):
        handler.redirect_request(request, None, 302, "Found", {}, "ftp://cdn.example/m.gguf")
