"""The resumable verified download against a real HTTP server with Range support (loopback)."""

import hashlib
import json
import os
import threading
import time

import pytest

from ansible_collections.prima.cluster.plugins.module_utils import range_server
from ansible_collections.prima.cluster.plugins.module_utils.weights_download import (PARTIAL_SUFFIX, STAMP_SUFFIX,
                                                                                     DownloadError, download_verified)

PAYLOAD = bytes(range(256)) * 4096 + b"tail"  # 1 MiB + 4 bytes
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()


@pytest.fixture
def hub(tmp_path):
    root = tmp_path / "hub"
    (root / "org" / "repo" / "resolve" / "main").mkdir(parents=True)
    (root / "org" / "repo" / "resolve" / "main" / "model.gguf").write_bytes(PAYLOAD)
    log = tmp_path / "hub.log"
    server = range_server.make_server(str(root), "127.0.0.1", 0, str(log))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = "http://127.0.0.1:%d" % server.server_address[1]
    yield base + "/org/repo/resolve/main/model.gguf", root, log
    server.shutdown()
    server.server_close()


def served(log, count=1):
    """The server's log, once it holds `count` records (it writes each after the response)."""
    deadline = time.monotonic() + 5
    records = []
    while time.monotonic() < deadline:
        records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        if len(records) >= count:
            break
        time.sleep(0.02)
    return records


def test_cold_download_then_stamp(hub, tmp_path):
    url, dummy, log = hub
    dest = str(tmp_path / "models" / "model.gguf")
    progress = str(tmp_path / "progress.json")
    first = download_verified(url, dest, DIGEST, progress_path=progress)
    assert first["changed"] and first["verified_by"] == "download" and first["sha256"] == DIGEST
    assert first["downloaded_bytes"] == len(PAYLOAD) and first["resumed_from"] == 0
    with open(dest, "rb") as handle:
        assert handle.read() == PAYLOAD
    assert not os.path.exists(dest + PARTIAL_SUFFIX)
    assert json.load(open(progress))["state"] == "done"
    second = download_verified(url, dest, DIGEST)
    assert not second["changed"] and second["verified_by"] == "stamp" and second["downloaded_bytes"] == 0
    assert len(served(log)) == 1


def test_resume_sends_a_range_and_gets_only_the_rest(hub, tmp_path):
    url, dummy, log = hub
    dest = str(tmp_path / "model.gguf")
    with open(dest + PARTIAL_SUFFIX, "wb") as handle:
        handle.write(PAYLOAD[:300000])
    result = download_verified(url, dest, DIGEST)
    assert result["resumed_from"] == 300000
    assert result["downloaded_bytes"] == len(PAYLOAD) - 300000
    [request] = served(log)
    assert request["status"] == 206 and request["range"] == "bytes=300000-"
    assert request["bytes"] == len(PAYLOAD) - 300000


def test_complete_partial_needs_no_body(hub, tmp_path):
    url, dummy, log = hub
    dest = str(tmp_path / "model.gguf")
    with open(dest + PARTIAL_SUFFIX, "wb") as handle:
        handle.write(PAYLOAD)
    result = download_verified(url, dest, DIGEST)
    assert result["sha256"] == DIGEST and result["downloaded_bytes"] == 0
    assert served(log)[0]["status"] == 416


def test_flipped_byte_is_detected_and_fetched_again(hub, tmp_path):
    url, dummy, dummy = hub
    dest = str(tmp_path / "model.gguf")
    download_verified(url, dest, DIGEST)
    with open(dest, "r+b") as handle:
        handle.seek(1000)
        byte = handle.read(1)
        handle.seek(1000)
        handle.write(bytes([byte[0] ^ 0xFF]))
    result = download_verified(url, dest, DIGEST)
    assert result["replaced_corrupt"] and result["verified_by"] == "download"
    with open(dest, "rb") as handle:
        assert handle.read() == PAYLOAD


def test_wrong_bytes_fail_and_leave_nothing_under_the_final_name(hub, tmp_path):
    url, root, dummy = hub
    (root / "org" / "repo" / "resolve" / "main" / "model.gguf").write_bytes(PAYLOAD[:-1] + b"X")
    dest = str(tmp_path / "model.gguf")
    with pytest.raises(DownloadError, match="sha256 of the downloaded model.gguf is .* expected %s" % DIGEST):
        download_verified(url, dest, DIGEST)
    assert sorted(os.listdir(str(tmp_path))) == ["hub", "hub.log"]


def test_without_expected_digest_the_digest_is_reported(hub, tmp_path):
    url, dummy, dummy = hub
    dest = str(tmp_path / "model.gguf")
    result = download_verified(url, dest, None)
    assert result["sha256"] == DIGEST
    assert json.load(open(dest + STAMP_SUFFIX))["sha256"] == DIGEST


def test_missing_file_fails_at_once_naming_the_catalog(hub, tmp_path):
    url, dummy, log = hub
    with pytest.raises(DownloadError, match="404: check the repository, revision and file name"):
        download_verified(url.replace("model.gguf", "nope.gguf"), str(tmp_path / "nope.gguf"), retries=3)
    assert len(served(log)) == 1


def test_unreachable_server_keeps_partial_and_says_so(tmp_path):
    dest = str(tmp_path / "model.gguf")
    with open(dest + PARTIAL_SUFFIX, "wb") as handle:
        handle.write(b"abc")
    with pytest.raises(DownloadError, match="gave up after 2 attempts.*next run resumes it"):
        download_verified("http://127.0.0.1:9/x", dest, DIGEST, retries=1, timeout=2, retry_delay=0.01)
    assert os.path.getsize(dest + PARTIAL_SUFFIX) == 3 and not os.path.exists(dest)


@pytest.mark.parametrize("header, size, expected", [
    ("bytes=0-", 10, (0, 9)), ("bytes=3-5", 10, (3, 5)), ("bytes=-4", 10, (6, 9)),
    ("bytes=8-100", 10, (8, 9)), (None, 10, None), ("items=1-2", 10, None),
])
def test_parse_range(header, size, expected):
    assert range_server.parse_range(header, size) == expected


def test_parse_range_past_the_end():
    with pytest.raises(ValueError):
        range_server.parse_range("bytes=10-", 10)


def test_resolve_refuses_escapes(tmp_path):
    assert range_server.resolve(str(tmp_path), "/a/b.gguf?x=1") == os.path.join(str(tmp_path), "a", "b.gguf")
    assert range_server.resolve(str(tmp_path), "/../etc/passwd") is None or \
        range_server.resolve(str(tmp_path), "/../etc/passwd").startswith(str(tmp_path))


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
