"""What the hub says a file is (the sandbox hub on loopback), and how the run takes it: digest, size, commit."""

import hashlib
import json
import os
import socket
import threading
import urllib.request

import pytest

from ansible_collections.prima.cluster.plugins.module_utils.hub_metadata import HubError, head, parse_file_metadata
from ansible_collections.prima.cluster.plugins.plugin_utils.models.catalog import (
    hub_query, lock_problems, lock_updates, models_files, parse_lock, with_hub_metadata)
from test_weights_download import hub_server, serve

PAYLOAD = b"GGUF" + bytes(range(256)) * 64
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()
OTHER = b"GGUF" + b"moved on" * 100
LOCK_FILE = "inventory/models.lock.json"
CATALOG = {"m": {"hub_repo": "org/repo", "revision": "main", "n_layer": 8,
                 "files": [{"name": "m.gguf", "size": len(PAYLOAD), "sha256": None}]}}


@pytest.fixture
def hub(tmp_path):
    """publish(payload, **options) -> commit; .base is the hub's URL."""
    server = hub_server.HubServer(str(tmp_path / "hub"), "127.0.0.1", 0, str(tmp_path / "hub.log"))
    base = serve(server)

    def publish(payload=PAYLOAD, name="m.gguf", **options):
        staging = tmp_path / ("staging-" + hashlib.sha1(payload).hexdigest())
        staging.mkdir(exist_ok=True)
        (staging / name).write_bytes(payload)
        return hub_server.publish(str(tmp_path / "hub" / "org" / "repo"), str(staging), **options)

    publish.base = base
    yield publish
    server.shutdown()
    server.server_close()


def test_head_reads_commit_digest_and_size_without_following_the_redirect(hub):
    commit = hub()
    answer = head(hub.base + "/org/repo/resolve/main/m.gguf")
    assert answer == {"commit": commit, "sha256": DIGEST, "size": len(PAYLOAD), "lfs": True}


def test_a_file_without_lfs_has_a_commit_and_size_but_no_digest(hub):
    commit = hub(no_lfs=["m.gguf"])
    answer = head(hub.base + "/org/repo/resolve/main/m.gguf")
    assert answer == {"commit": commit, "sha256": None, "size": len(PAYLOAD), "lfs": False}


def test_the_api_answers_like_the_hub(hub):
    commit = hub()
    revision = json.load(urllib.request.urlopen(hub.base + "/api/models/org/repo/revision/main"))
    assert revision["sha"] == commit
    assert revision["siblings"] == [{"rfilename": "m.gguf", "size": len(PAYLOAD),
                                     "lfs": {"sha256": DIGEST, "size": len(PAYLOAD), "pointerSize": 134}}]
    [entry] = json.load(urllib.request.urlopen(hub.base + "/api/models/org/repo/tree/" + commit))
    assert entry["lfs"]["oid"] == DIGEST and entry["path"] == "m.gguf"


@pytest.mark.parametrize("url, message", [
    ("/org/repo/resolve/main/nope.gguf", "404 .EntryNotFound.: check hub_repo, revision and the file name"),
    ("/org/repo/resolve/v9/m.gguf", "404 .RevisionNotFound."),
])
def test_head_errors_name_the_url(hub, url, message):
    hub()
    with pytest.raises(HubError, match=message):
        head(hub.base + url)


@pytest.mark.parametrize("headers, message", [
    ({"X-Linked-Etag": '"abc"'}, "X-Linked-Etag 'abc', which is not a sha256"),
    ({"X-Repo-Commit": "main"}, "X-Repo-Commit 'main', which is not a git commit id"),
    ({"X-Linked-Etag": '"%s"' % DIGEST, "X-Linked-Size": "9" * 30}, "X-Linked-Size '9999"),
    ({"Content-Length": "-1"}, "Content-Length '-1', which is not a size"),
])
def test_malformed_hub_headers_are_named(headers, message):
    with pytest.raises(HubError, match="http://hub/f answered " + message):
        parse_file_metadata("http://hub/f", 200, headers)


def test_unreachable_hub_is_named():
    with pytest.raises(HubError, match="the hub did not answer"):
        head("http://127.0.0.1:9/org/repo/resolve/main/m.gguf", timeout=2)


def files(lock=None):
    return models_files(["m"], CATALOG, lock or {}, "http://hub")


def test_hub_digest_and_commit_become_what_is_fetched_and_locked():
    commit = "c" * 40
    view = with_hub_metadata(files(), {"m.gguf": {"commit": commit, "sha256": DIGEST, "size": len(PAYLOAD),
                                                  "lfs": True}}, "http://hub", LOCK_FILE)
    [record] = view["files"]
    assert view["problems"] == [] and view["notices"] == []
    assert record["sha256"] == DIGEST and record["digest_source"] == "hub"
    assert record["url"] == "http://hub/org/repo/resolve/%s/m.gguf" % commit
    lock = lock_updates({}, view["files"], {"m.gguf": DIGEST})
    assert lock == {"org/repo@main/m.gguf": {"sha256": DIGEST, "commit": commit, "size": len(PAYLOAD)}}
    [locked] = files(lock)
    assert locked["url"] == record["url"] and locked["sha256"] == DIGEST and locked["digest_source"] == "lock"
    assert hub_query(locked) == {"name": "m.gguf", "url": record["url"],
                                 "revision_url": "http://hub/org/repo/resolve/main/m.gguf"}


def test_a_hub_that_disagrees_with_the_catalog_or_the_lock_stops_the_run():
    catalog_pinned = [dict(files()[0], sha256="a" * 64, digest_source="catalog")]
    view = with_hub_metadata(catalog_pinned, {"m.gguf": {"commit": "c" * 40, "sha256": DIGEST, "size": 1}},
                             "http://hub", LOCK_FILE)
    [problem] = view["problems"]
    assert "the hub says its sha256 is %s, the catalog says %s" % (DIGEST, "a" * 64) in problem
    locked = files({"org/repo@main/m.gguf": {"sha256": "b" * 64, "commit": "c" * 40, "size": 9}})
    [problem] = with_hub_metadata(locked, {"m.gguf": {"commit": "c" * 40, "sha256": DIGEST, "size": 9}},
                                  "http://hub", LOCK_FILE)["problems"]
    assert "the lock file says %s" % ("b" * 64) in problem and "remove org/repo@main/m.gguf from %s" % LOCK_FILE in problem


def test_a_moved_repository_is_held_to_the_locked_commit_and_says_so():
    locked = files({"org/repo@main/m.gguf": {"sha256": DIGEST, "commit": "a" * 40, "size": len(PAYLOAD)}})
    view = with_hub_metadata(locked, {"m.gguf": {"commit": "a" * 40, "sha256": DIGEST, "size": len(PAYLOAD),
                                                 "revision_commit": "b" * 40}}, "http://hub", LOCK_FILE)
    assert view["files"][0]["url"] == "http://hub/org/repo/resolve/%s/m.gguf" % ("a" * 40)
    [notice] = view["notices"]
    assert notice.startswith("NOTICE: org/repo@main has moved to bbbbbbbbbbbb; %s holds m.gguf to commit aaaaaaaaaaaa"
                             % LOCK_FILE)


def test_without_lfs_the_first_download_is_pinned_with_a_notice():
    view = with_hub_metadata(files(), {"m.gguf": {"commit": "c" * 40, "sha256": None, "size": len(PAYLOAD),
                                                  "lfs": False}}, "http://hub", LOCK_FILE)
    [record] = view["files"]
    assert record["digest_source"] == "first download" and record["sha256"] == ""
    assert record["expected_size"] == len(PAYLOAD) and "/resolve/%s/" % ("c" * 40) in record["url"]
    [notice] = view["notices"]
    assert "gives no LFS digest (X-Linked-Etag)" in notice and LOCK_FILE in notice


def test_the_hub_size_wins_over_the_catalog_with_a_notice():
    view = with_hub_metadata(files(), {"m.gguf": {"commit": "c" * 40, "sha256": DIGEST, "size": 5}},
                             "http://hub", LOCK_FILE)
    assert view["files"][0]["expected_size"] == 5
    assert "the hub says 5 bytes, the catalog %d" % len(PAYLOAD) in view["notices"][0]


def test_a_lock_of_version_1_still_reads():
    [record] = files({"org/repo@main/m.gguf": DIGEST})
    assert record["sha256"] == DIGEST and record["digest_source"] == "lock" and record["commit"] is None
    assert record["url"] == "http://hub/org/repo/resolve/main/m.gguf"


def test_published_commit_is_reproducible(hub):
    assert hub() == hub()
    assert hub(OTHER) != hub()
    assert os.path.basename(head(hub.base + "/org/repo/resolve/main/m.gguf")["commit"]) == hub()


def raw_server(payload):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)

    def answer():
        while True:
            try:
                connection, dummy = listener.accept()
            except OSError:
                return
            try:
                connection.recv(65536)
                connection.sendall(payload)
            except OSError:
                pass
            connection.close()

    threading.Thread(target=answer, daemon=True).start()
    return listener, "http://127.0.0.1:%d" % listener.getsockname()[1]


@pytest.mark.parametrize("payload", [
    b"HELLO GARBAGE\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % index for index in range(150)) + b"\r\n",
])
def test_garbage_from_the_hub_is_a_hub_error(payload):
    listener, base = raw_server(payload)
    try:
        with pytest.raises(HubError, match="not an answer of the hub"):
            head(base + "/org/repo/resolve/main/m.gguf", timeout=2)
    finally:
        listener.close()


def test_a_url_with_a_space_is_a_hub_error():
    with pytest.raises(HubError, match="not an answer of the hub"):
        head("http://127.0.0.1:9/org/repo/resolve/main/a b.gguf")


@pytest.mark.parametrize("lock, problem", [
    ([], "is not a JSON object"),
    ("{not json", "is not a JSON object"),
    ({"org/repo@main/m.gguf": None}, "is 'None', not {sha256, commit, size}"),
    ({"org/repo@main/m.gguf": ["1" * 64, "a" * 40]}, "not {sha256, commit, size}"),
    ({"org/repo@main/m.gguf": 7}, "is '7', not"),
    ({"org/repo@main/m.gguf": "abc"}, "is 'abc', not a sha256"),
    ({"org/repo@main/m.gguf": {"sha256": 5}}, "has sha256 '5', not 64 hex digits"),
    ({"org/repo@main/m.gguf": {"sha256": DIGEST, "commit": "main"}}, "has commit 'main', not a 40-digit"),
    ({"org/repo@main/m.gguf": {"sha256": DIGEST, "commit": "a" * 40 + "\n"}}, None),
    ({"org/repo@main/m.gguf": {"sha256": DIGEST, "size": "abc"}}, "has size 'abc', not a size in bytes"),
    ({"org/repo@main/m.gguf": {"sha256": " " + DIGEST.upper(), "commit": "A" * 40, "size": 9}}, None),
])
def test_a_broken_lock_entry_stops_the_run_naming_it(lock, problem):
    problems = lock_problems(parse_lock(lock) if isinstance(lock, str) else lock, LOCK_FILE)
    if problem is None:
        assert problems == []
        [record] = files(lock)
        assert record["sha256"] == DIGEST and "\n" not in record["url"] and record["url"].count("a" * 40) <= 1
    else:
        [message] = problems
        assert problem in message and LOCK_FILE in message


def test_a_hub_answering_for_another_commit_or_an_empty_file_stops_the_run():
    locked = files({"org/repo@main/m.gguf": {"sha256": DIGEST, "commit": "a" * 40, "size": len(PAYLOAD)}})
    [problem] = with_hub_metadata(locked, {"m.gguf": {"commit": "b" * 40, "sha256": DIGEST, "size": len(PAYLOAD)}},
                                  "http://hub", LOCK_FILE)["problems"]
    assert "asked for commit %s, the hub answered for commit %s" % ("a" * 40, "b" * 40) in problem
    [problem] = with_hub_metadata(files(), {"m.gguf": {"commit": "c" * 40, "sha256": DIGEST, "size": 0}},
                                  "http://hub", LOCK_FILE)["problems"]
    assert "the hub says the file is empty" in problem
