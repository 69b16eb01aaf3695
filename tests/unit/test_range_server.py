"""The fan-out file server on loopback: what it serves, its ranges, its limits, when it stops by itself."""

import http.client
import importlib.util
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A program the models role copies onto a node, not a package module: loaded from its file.
SCRIPT = os.path.join(ROOT, "roles", "models", "files", "range_server.py")


def load_range_server():
    spec = importlib.util.spec_from_file_location("range_server", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


range_server = load_range_server()

PAYLOAD = bytes(range(256)) * 256  # 64 KiB
SMALL = b"the second file\n"
HALF_SENT = b"GET /a.gguf HTTP/1.1\r\nHost: peer\r\n"  # no blank line: the request never ends


@pytest.fixture
def models(tmp_path):
    """A weights directory as the source node has it, with a secret beside it."""
    root = tmp_path / "models"
    root.mkdir()
    (root / "a.gguf").write_bytes(PAYLOAD)
    (root / "b.gguf").write_bytes(SMALL)
    (root / "a.gguf.partial").write_bytes(PAYLOAD[:10])
    (root / ".a.gguf.progress").write_text('{"state": "done"}')
    (root / ".fanout.log").write_text("")
    (root / "sub").mkdir()
    (root / "sub" / "c.gguf").write_bytes(SMALL)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    (root / "linked.gguf").symlink_to(outside / "secret.txt")
    (root / "linked").symlink_to(outside)
    os.mkfifo(str(root / "fifo.gguf"))
    return root


def running(server):
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def serve(tmp_path):
    """serve(root, **make_server options) -> port; every server is shut down at the end."""
    servers = []

    def start(root, **options):
        server = unstarted(root, tmp_path, **options)
        servers.append(server)
        running(server)
        return server.server_address[1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def request(port, path, headers=None, method="GET"):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request(method, path, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def log_records(tmp_path, count=1):
    """The server's log, once it holds `count` records (it writes each after its response)."""
    path = tmp_path / "served.log"
    deadline = time.monotonic() + 5
    while True:
        records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.02)


def responses(tmp_path, count):
    """The log's records of responses (not of connections broken between requests), once there are `count`."""
    deadline = time.monotonic() + 5
    while True:
        records = [record for record in log_records(tmp_path, count) if record["status"]]
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.02)


def half_sent(port, count):
    sockets = []
    for dummy in range(count):
        connection = socket.create_connection(("127.0.0.1", port), timeout=5)
        connection.sendall(HALF_SENT)
        sockets.append(connection)
    return sockets


def served_eventually(port, within):
    """The first 200 a new client gets, retrying 503s and resets as the peers' downloader does."""
    deadline = time.monotonic() + within
    while True:
        try:
            status, dummy, body = request(port, "/a.gguf")
            if status == 200:
                return body
        except OSError:
            pass
        assert time.monotonic() < deadline, "a new client was not served within %ss" % within
        time.sleep(0.2)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_cli(tmp_path, args, limit_fds=None):
    """The server as the play runs it; returns (process, port) once it listens."""
    port = free_port()
    argv = [sys.executable, SCRIPT, "--bind", "127.0.0.1", "--port", str(port), "--log",
            str(tmp_path / "served.log")] + args
    preexec = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit_fds, limit_fds))) if limit_fds else None
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                               preexec_fn=preexec)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, port
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                out, err = process.communicate()
                pytest.fail("the server did not listen (exit %s): %s%s" % (process.returncode, out, err))
            time.sleep(0.05)


@pytest.fixture
def cli(tmp_path):
    processes = []

    def start(args, limit_fds=None):
        process, port = start_cli(tmp_path, args, limit_fds)
        processes.append(process)
        return process, port

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.communicate()


# Files: the catalog's, and nothing else


@pytest.mark.parametrize("path", [
    "/.fanout.log", "/.a.gguf.progress", "/a.gguf.partial", "/b.gguf", "/sub/c.gguf", "/linked/secret.txt",
    "/../outside/secret.txt", "/%2e%2e/outside/secret.txt", "/a.gguf/", "/",
])
def test_only_the_named_files_are_served(models, serve, tmp_path, path):
    port = serve(models, files=["a.gguf"])
    status, dummy, body = request(port, "/a.gguf")
    assert (status, body) == (200, PAYLOAD)
    status, dummy, body = request(port, path)
    assert status == 404 and b"secret" not in body
    refused = [record for record in log_records(tmp_path, 2) if record["status"] == 404]
    assert refused and refused[-1]["path"] == path and refused[-1]["why"]


def test_a_symlink_under_a_served_name_is_not_followed(models, serve):
    port = serve(models, files=["a.gguf", "linked.gguf"])
    status, dummy, body = request(port, "/linked.gguf")
    assert (status, body) == (404, b"not found\n")


def test_without_a_list_no_symlink_leads_out_of_the_root(models, serve):
    """The tree mode (every non-hidden file below the root) follows no symlink either, at any depth."""
    port = serve(models)
    assert request(port, "/sub/c.gguf")[0] == 200
    for path in ("/linked.gguf", "/linked/secret.txt", "/.fanout.log"):
        status, dummy, body = request(port, path)
        assert status == 404 and b"secret" not in body, path


def test_a_fifo_under_a_served_name_is_refused_at_once(models, serve):
    port = serve(models, files=["fifo.gguf"])
    started = time.monotonic()
    assert request(port, "/fifo.gguf")[0] == 404
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("name", ["../a.gguf", "sub/c.gguf", ".fanout.log", ".", "..", ""])
def test_only_plain_names_can_be_served(models, tmp_path, name):
    with pytest.raises(ValueError, match="not plain file names"):
        unstarted(models, tmp_path, files=["a.gguf", name])


def test_copies_can_only_be_expected_of_served_files(models, tmp_path):
    with pytest.raises(ValueError, match="b.gguf"):
        unstarted(models, tmp_path, files=["a.gguf"], expected={"b.gguf": 1})


def test_the_command_line_names_its_files(models, tmp_path):
    """Without --file it refuses to start, rather than serve the whole directory."""
    result = subprocess.run([sys.executable, SCRIPT, "--root", str(models), "--bind", "127.0.0.1", "--port",
                             str(free_port()), "--log", str(tmp_path / "log")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=10,
                            check=False)
    assert result.returncode == 2 and "--file" in result.stderr


# Ranges


@pytest.mark.parametrize("header, size, expected", [
    ("bytes=0-", 10, (0, 9)), ("bytes=3-5", 10, (3, 5)), ("bytes=-4", 10, (6, 9)), ("bytes=-40", 10, (0, 9)),
    ("bytes=8-100", 10, (8, 9)), ("bytes=5-5", 10, (5, 5)), ("Bytes=2-3", 10, (2, 3)), (None, 10, None),
    ("", 10, None), ("items=1-2", 10, None), ("bytes", 10, None),
])
def test_parse_range(header, size, expected):
    assert range_server.parse_range(header, size) == expected


@pytest.mark.parametrize("header, size", [
    ("bytes=5-3", 10), ("bytes=10-", 10), ("bytes=0-1,5-6", 10), ("bytes=-", 10), ("bytes=abc", 10),
    ("bytes=-0", 10), ("bytes=1-2", 0), ("bytes=-5", 0), ("bytes=" + "9" * 30 + "-", 10), ("bytes=-1-2", 10),
])
def test_parse_range_refuses_what_is_answered_416(header, size):
    with pytest.raises(ValueError):
        range_server.parse_range(header, size)


@pytest.mark.parametrize("header", ["bytes=5-3", "bytes=0-1,5-6", "bytes=x-"])
def test_an_unservable_range_is_answered_416(models, serve, header):
    port = serve(models)
    status, headers, body = request(port, "/a.gguf", {"Range": header})
    assert (status, headers["Content-Range"], headers["Content-Length"], body) == \
        (416, "bytes */%d" % len(PAYLOAD), "0", b"")


def test_a_range_is_served_as_asked(models, serve):
    port = serve(models)
    status, headers, body = request(port, "/a.gguf", {"Range": "bytes=100-199"})
    assert (status, headers["Content-Range"], body) == (206, "bytes 100-199/%d" % len(PAYLOAD), PAYLOAD[100:200])


def test_a_resume_of_another_version_gets_the_whole_file(models, serve):
    """If-Range (what the downloader sends with its ETag): the range only while the file is the same."""
    port = serve(models, files=["a.gguf"])
    etag = request(port, "/a.gguf", method="HEAD")[1]["ETag"]
    assert not etag.startswith("W/")
    assert request(port, "/a.gguf", {"Range": "bytes=100-", "If-Range": etag})[:3:2] == (206, PAYLOAD[100:])
    (models / "a.gguf.new").write_bytes(PAYLOAD[::-1])
    os.replace(str(models / "a.gguf.new"), str(models / "a.gguf"))
    assert request(port, "/a.gguf", {"Range": "bytes=100-", "If-Range": etag})[:3:2] == (200, PAYLOAD[::-1])


# Connections: a timeout each, and a cap on how many are served at once


def test_half_sent_requests_neither_pile_up_threads_nor_lock_out_new_clients(models, serve, tmp_path):
    port = serve(models, files=["a.gguf"], connection_timeout=1, max_connections=8)
    before = threading.active_count()
    held = half_sent(port, 100)
    try:
        time.sleep(0.3)
        assert threading.active_count() <= before + 8
        assert served_eventually(port, within=6) == PAYLOAD
    finally:
        for connection in held:
            connection.close()
    assert any(record["status"] == 503 for record in log_records(tmp_path))


def test_a_stalled_connection_is_closed_after_the_timeout(models, serve):
    port = serve(models, files=["a.gguf"], connection_timeout=0.5)
    [connection] = half_sent(port, 1)
    connection.settimeout(5)
    started = time.monotonic()
    assert connection.recv(100) == b""  # closed by the server, without an answer
    assert 0.3 < time.monotonic() - started < 3
    connection.close()


def test_with_a_low_fd_limit_new_clients_are_still_served(models, cli):
    """300 half-sent requests against a server allowed 64 descriptors (before: 60 threads, every
    descriptor taken, and a new client timed out)."""
    process, port = cli(["--root", str(models), "--file", "a.gguf", "--connection-timeout", "1"], limit_fds=64)
    held = []
    try:
        for dummy in range(300):
            try:
                held.extend(half_sent(port, 1))
            except OSError:
                pass
        with open("/proc/%d/status" % process.pid) as handle:
            threads = int([line.split()[1] for line in handle if line.startswith("Threads:")][0])
        assert threads <= range_server.connection_cap(32, 64) + 2
        assert served_eventually(port, within=8) == PAYLOAD
    finally:
        for connection in held:
            connection.close()


@pytest.mark.parametrize("requested, fd_limit, expected", [
    (32, 1024, 32), (32, 64, 24), (32, 10, 1), (500, -1, 500),
])
def test_connection_cap(requested, fd_limit, expected):
    assert range_server.connection_cap(requested, fd_limit) == expected


# Stopping: once the transfer is over, or once nothing happened for the quiet time


@pytest.mark.parametrize("status, last, sent, length, expected", [
    (200, 99, 100, 100, True),
    (206, 99, 60, 60, True),  # a resumed download (bytes=40-): the client holds the first 40 bytes
    (206, 49, 50, 50, False),  # not to the end
    (200, 99, 70, 100, False),  # the connection broke mid-body
    (416, -1, 0, 0, False),  # even for bytes=100-: the downloader starts over
    (404, -1, 0, 0, False),
])
def test_copy_completed(status, last, sent, length, expected):
    assert range_server.copy_completed(status, last, 100, sent, length) is expected


@pytest.mark.parametrize("now, last_activity, open_connections, all_sent, expected", [
    (10, 0, 0, False, None),
    (61, 0, 0, False, "no connection for 60s"),  # quiet since the start: nobody came
    (200, 0, 1, False, None),  # a connection open: a peer at work
    (200, 190, 0, False, None),
    (200, 196, 0, True, None),
    (200, 195, 0, True, "every expected copy was sent"),
    (200, 0, 3, True, None),
    (600, 599, 2, False, "up for 600s"),
])
def test_stop_reason(now, last_activity, open_connections, all_sent, expected):
    limits = range_server.Limits(idle_s=60, max_s=600, linger_s=5)
    reason = range_server.stop_reason(now, 0, last_activity, open_connections, all_sent, limits)
    assert reason == expected if expected is None else reason.startswith(expected)


def test_without_limits_it_never_stops_by_itself():
    assert range_server.stop_reason(10 ** 6, 0, 0, 0, False, range_server.Limits(linger_s=0)) is None


def unstarted(root, tmp_path, **options):
    return range_server.make_server(str(root), "127.0.0.1", 0, str(tmp_path / "served.log"), **options)


def stopping(server, limits):
    """serve_until_done in a thread; returns (thread, reasons)."""
    reasons = []

    def serve():
        reasons.append(range_server.serve_until_done(server, limits, check_every=0.05))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread, reasons


def test_it_stops_once_every_expected_copy_was_sent(models, tmp_path):
    server = unstarted(models, tmp_path, files=["a.gguf", "b.gguf"], expected={"a.gguf": 2, "b.gguf": 1})
    port = server.server_address[1]
    thread, reasons = stopping(server, range_server.Limits(idle_s=60, max_s=60, linger_s=0.2))
    try:
        assert request(port, "/a.gguf", {"Range": "bytes=0-99"})[0] == 206
        assert request(port, "/a.gguf", {"Range": "bytes=100-"})[0] == 206  # first copy, resumed
        assert request(port, "/a.gguf", method="HEAD")[0] == 200
        assert request(port, "/b.gguf", {"Range": "bytes=%d-" % len(SMALL)})[0] == 416
        assert request(port, "/b.gguf")[2] == SMALL
        time.sleep(0.5)
        assert thread.is_alive(), "stopped with a copy of a.gguf still owed"
        assert request(port, "/a.gguf")[2] == PAYLOAD
        thread.join(timeout=3)
        assert not thread.is_alive() and reasons == ["every expected copy was sent"]
    finally:
        server.shutdown()
        server.server_close()


def test_a_tail_range_is_no_copy(models, serve, tmp_path):
    """`bytes=-1` and `bytes=<last>-` run to the end of the file, but hold 2 bytes of it, not two copies."""
    server = unstarted(models, tmp_path, files=["a.gguf"], expected={"a.gguf": 2})
    running(server)
    try:
        port = server.server_address[1]
        assert request(port, "/a.gguf", {"Range": "bytes=-1"})[0] == 206
        assert request(port, "/a.gguf", {"Range": "bytes=%d-" % (len(PAYLOAD) - 1)})[0] == 206
        log_records(tmp_path, 2)
        assert server.transfer.owed["a.gguf"] == 2
        assert server.transfer.stop_reason(range_server.Limits(linger_s=0.01)) is None
    finally:
        server.shutdown()
        server.server_close()


def test_a_lost_tail_then_its_resume_is_one_copy(tmp_path):
    """The downloader's own pattern: a 200 all handed to the kernel but read by the peer only in part, then
    the peer's `bytes=K-` with If-Range: one peer holds a copy, and one copy is still owed."""
    size = 200000  # fits in the socket buffers: the server sends all of it
    (tmp_path / "a.gguf").write_bytes(b"y" * size)
    server = unstarted(tmp_path, tmp_path, files=["a.gguf"], expected={"a.gguf": 2})
    running(server)
    try:
        port = server.server_address[1]
        peer = socket.create_connection(("127.0.0.1", port), timeout=5)
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        peer.sendall(b"GET /a.gguf HTTP/1.1\r\nHost: peer\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += peer.recv(1)
        etag = [line.split(b": ", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(b"etag")][0]
        got = len(peer.recv(1000))
        [record] = log_records(tmp_path, 1)
        assert record["bytes"] == size  # the server believes it sent the whole file
        peer.close()
        status, dummy, body = request(port, "/a.gguf", {"Range": "bytes=%d-" % got, "If-Range": etag.decode()})
        assert status == 206 and got + len(body) == size
        responses(tmp_path, 2)
        assert server.transfer.owed["a.gguf"] == 1
        assert server.transfer.stop_reason(range_server.Limits(linger_s=0.01)) is None
        assert request(port, "/a.gguf")[0] == 200  # the second peer
        responses(tmp_path, 3)
        assert server.transfer.owed["a.gguf"] == 0
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("ends, sent, expected", [
    (2, 200, 0), (2, 199, 1), (1, 500, 1), (3, 250, 0), (0, 0, 2),
])
def test_copies_need_both_the_ends_and_the_bytes(ends, sent, expected):
    transfer = range_server.Transfer({"a.gguf": 2})
    for dummy in range(ends):
        transfer.sent("a.gguf", 100, 0, True)
    transfer.sent("a.gguf", 100, sent, False)
    assert transfer.owed["a.gguf"] == expected


def test_a_slowloris_is_closed_at_the_head_deadline(models, serve, tmp_path):
    """A byte of request head every 0.3 s: closed once the whole head took the connection timeout, so it
    holds no slot and no stop off."""
    server = unstarted(models, tmp_path, files=["a.gguf"], connection_timeout=1, max_connections=2)
    running(server)
    dripping = [socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) for dummy in range(2)]
    stop = threading.Event()

    def drip():
        try:
            for connection in dripping:
                connection.sendall(b"GET /a.gguf HTTP/1.1\r\n")
            while not stop.is_set():
                for connection in dripping:
                    connection.sendall(b"X")
                time.sleep(0.3)
        except OSError:
            pass

    started = time.monotonic()
    threading.Thread(target=drip, daemon=True).start()
    try:
        for connection in dripping:
            assert connection.recv(100) == b""  # closed by the server, without an answer
        assert time.monotonic() - started < 3
        assert served_eventually(server.server_address[1], within=2) == PAYLOAD
        deadline = time.monotonic() + 2
        while server.transfer.open_connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.transfer.stop_reason(range_server.Limits(idle_s=0.01)) is not None
    finally:
        stop.set()
        for connection in dripping:
            connection.close()
        server.shutdown()
        server.server_close()


def test_a_connection_past_its_head_deadline_is_not_active():
    now = [0.0]
    transfer = range_server.Transfer({}, clock=lambda: now[0])
    transfer.opened("slow", head_deadline=1.0)
    transfer.opened("busy", head_deadline=1.0)
    transfer.head_read("busy")
    now[0] = 5.0
    assert transfer.active_connections() == 1
    transfer.closed("busy")
    now[0] = 7.0
    assert transfer.stop_reason(range_server.Limits(idle_s=1)).startswith("no connection")


def test_a_file_cut_while_served_closes_the_connection(tmp_path):
    """Fewer bytes than Content-Length promised: the client gets EOF, not a keep-alive wait for the rest."""
    size = 64 << 20
    served = tmp_path / "a.gguf"
    served.write_bytes(b"\0" * size)
    server = unstarted(tmp_path, tmp_path, files=["a.gguf"], connection_timeout=5)
    running(server)
    try:
        peer = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5)
        peer.sendall(b"GET /a.gguf HTTP/1.1\r\nHost: peer\r\n\r\n")
        peer.recv(4096)
        os.truncate(str(served), 0)
        total = 0
        while True:
            data = peer.recv(1 << 20)  # a socket.timeout here: the connection was left open
            if not data:
                break
            total += len(data)
        peer.close()
        assert total < size
        [record] = log_records(tmp_path, 1)
        assert record["bytes"] < size and "early" in record["why"]
    finally:
        server.shutdown()
        server.server_close()


def test_the_logged_path_and_range_are_capped(models, serve, tmp_path):
    port = serve(models, files=["a.gguf"])
    assert request(port, "/" + "a" * 60000, {"Range": "bytes=" + "1" * 5000})[0] == 404
    [record] = log_records(tmp_path, 1)
    assert len(record["path"]) == range_server.LOGGED_CHARS == len(record["range"])


def test_it_stops_when_nobody_comes(models, tmp_path):
    server = unstarted(models, tmp_path, files=["a.gguf"], expected={"a.gguf": 1})
    started = time.monotonic()
    thread, reasons = stopping(server, range_server.Limits(idle_s=0.5, max_s=60))
    thread.join(timeout=5)
    server.server_close()
    assert not thread.is_alive() and reasons[0].startswith("no connection for 0.5s")
    assert time.monotonic() - started < 3


def test_an_open_connection_holds_off_the_idle_stop(models, tmp_path):
    server = unstarted(models, tmp_path, files=["a.gguf"], connection_timeout=10)
    thread, reasons = stopping(server, range_server.Limits(idle_s=0.5, max_s=60))
    [connection] = half_sent(server.server_address[1], 1)
    time.sleep(1.2)
    assert thread.is_alive(), "stopped while a peer was connected"
    connection.close()
    thread.join(timeout=5)
    server.server_close()
    assert not thread.is_alive() and reasons[0].startswith("no connection")


def test_the_command_line_stops_once_the_copies_are_sent(models, cli, tmp_path):
    pid_file = tmp_path / "server.pid"
    process, port = cli(["--root", str(models), "--file", "a.gguf", "--file", "b.gguf", "--expect", "a.gguf",
                         "--expect", "a.gguf", "--idle-seconds", "60", "--linger-seconds", "0.2",
                         "--pid-file", str(pid_file)])
    assert int(pid_file.read_text()) == process.pid
    assert request(port, "/a.gguf")[2] == PAYLOAD
    assert request(port, "/a.gguf", {"Range": "bytes=0-63"})[2] == PAYLOAD[:64]  # a second peer, broken off
    assert request(port, "/a.gguf", {"Range": "bytes=64-"})[2] == PAYLOAD[64:]  # ... and resumed
    out, dummy = process.communicate(timeout=10)
    assert process.returncode == 0 and json.loads(out) == {"stopped": "every expected copy was sent"}
    assert not pid_file.exists()
    assert [record["status"] for record in log_records(tmp_path, 3)] == [200, 206, 206]


def test_the_command_line_stops_when_nobody_comes(models, cli):
    process, dummy = cli(["--root", str(models), "--file", "a.gguf", "--expect", "a.gguf", "--idle-seconds", "1"])
    out, dummy = process.communicate(timeout=10)
    assert process.returncode == 0 and "no connection for 1s" in out


@pytest.mark.parametrize("trouble", ["port taken", "file outside the root"])
def test_a_server_that_cannot_start_leaves_no_pid_file(models, tmp_path, trouble):
    """The pid file is written before the server listens (a peer that reaches the port finds it whole): one that
    never listens takes it away again."""
    pid_file = tmp_path / "server.pid"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1] if trouble == "port taken" else free_port()
        served = "a.gguf" if trouble == "port taken" else "../outside.gguf"
        done = subprocess.run([sys.executable, SCRIPT, "--bind", "127.0.0.1", "--port", str(port), "--log",
                               str(tmp_path / "served.log"), "--root", str(models), "--file", served,
                               "--pid-file", str(pid_file)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=30,
                              check=False)
    assert done.returncode != 0, done
    assert not pid_file.exists() and not list(tmp_path.glob("server.pid.*")), done.stderr


def test_a_second_server_on_a_taken_port_leaves_the_first_ones_pid_file(models, cli, tmp_path):
    pid_file = tmp_path / "server.pid"
    first, port = cli(["--root", str(models), "--file", "a.gguf", "--idle-seconds", "60",
                       "--pid-file", str(pid_file)])
    done = subprocess.run([sys.executable, SCRIPT, "--bind", "127.0.0.1", "--port", str(port), "--log",
                           str(tmp_path / "second.log"), "--root", str(models), "--file", "a.gguf",
                           "--pid-file", str(pid_file)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=30,
                          check=False)
    assert done.returncode != 0, done
    assert pid_file.read_text() == "%d\n" % first.pid
