"""Serve named files read-only over HTTP with Range requests, logging every response.

The cluster's fan-out source: one node serves the weights it fetched to the others, and stops by itself
once they have their copies, or once nobody has asked for anything for a while (its controller gone).
Standard library only, Python 3.8 compatible: it runs on the nodes.
"""

import argparse
import io
import json
import os
import re
import resource
import socket
import stat
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import BinaryIO, Callable, Dict, Iterable, Mapping, NamedTuple, Optional, Tuple
from urllib.parse import unquote

CHUNK = 1 << 20
CONNECTION_TIMEOUT_S = 60.0
MAX_CONNECTIONS = 32
# Beyond two per connection (its socket, its file): the listening socket, the log, stdio, Python's own.
FDS_KEPT_FREE = 16
# After the last expected copy, with no connection open: a peer whose last bytes were lost on the way
# resumes within this (the downloader retries after 2 s, then 4 s, ... 10 s), with room to spare.
DONE_LINGER_S = 60.0
# What the log keeps of a request's target and Range header (a hostile one may be 64 KiB a request).
LOGGED_CHARS = 512
# 20 digits hold any file size; more is not a range worth converting to an int.
RANGE_SPEC = re.compile(r"^(\d{0,20})-(\d{0,20})$")
BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\nContent-Length: 0\r\n"
                 b"Connection: close\r\n\r\n")


def parse_range(header: Optional[str], size: int) -> Optional[Tuple[int, int]]:
    """(first, last) inclusive, 0 <= first <= last < size, for a `bytes=` Range; None without one.

    A unit other than bytes is ignored (RFC 9110). Raises ValueError for what is answered 416: a
    malformed, multiple, reversed or empty range, or one that starts past the end (so any range of an
    empty file): a client gets either the bytes it asked for or an error, never the whole file instead.
    """
    if not header or not header.strip():
        return None
    unit, equals, spec = header.strip().partition("=")
    if not equals or unit.strip().lower() != "bytes":
        return None
    spec = spec.strip()
    if "," in spec:
        raise ValueError("multiple ranges are not served")
    match = RANGE_SPEC.match(spec)
    if not match or spec == "-":
        raise ValueError("malformed range %r" % spec[:40])
    if size == 0:
        raise ValueError("an empty file has no ranges")
    first_text, last_text = match.groups()
    if first_text == "":
        length = int(last_text)
        if length == 0:
            raise ValueError("empty suffix range")
        return max(size - length, 0), size - 1
    first = int(first_text)
    if last_text and int(last_text) < first:
        raise ValueError("range ends before it starts")
    if first >= size:
        raise ValueError("range starts past the end")
    last = min(int(last_text), size - 1) if last_text else size - 1
    return first, last


def plain_name(name: str) -> bool:
    """A file name with no directory in it and not hidden (the server's log and progress files are)."""
    return bool(name) and "/" not in name and "\0" not in name and not name.startswith(".")


def requested_name(url_path: str) -> Optional[str]:
    """The relative path ('a/b.gguf') a request target names; None unless each of its parts is plain."""
    path = unquote(url_path.split("?", 1)[0].split("#", 1)[0])
    if not path.startswith("/"):
        return None
    parts = path[1:].split("/")
    return "/".join(parts) if all(plain_name(part) for part in parts) else None


def resolve(root: str, url_path: str) -> Optional[str]:
    """The path under root that the URL names; None if it is not a plain relative path."""
    name = requested_name(url_path)
    return None if name is None else os.path.join(root, *name.split("/"))


def open_regular(root: str, name: str) -> Optional[BinaryIO]:
    """`name` (a/b) under root, opened without following any symlink; None unless it is a regular file."""
    parts = name.split("/")
    try:
        directory = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=directory)
            os.close(directory)
            directory = inner
        # O_NONBLOCK: a FIFO under a served name would otherwise hang the open until a writer came.
        descriptor = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=directory)
    except OSError:
        return None
    finally:
        os.close(directory)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        return None
    return os.fdopen(descriptor, "rb")


def copy_completed(status: int, last: int, size: int, sent: int, length: int) -> bool:
    """Whether a response may have left its client holding the whole file: it ran to the file's end.

    A resuming client asks `bytes=K-` because it holds the first K bytes, so such a response may
    complete a copy; but so may look a tail range, or a 200 whose end never reached the peer (then
    resumed): Transfer counts a copy only with the bytes of a whole file sent besides. Nothing else
    counts (a 416 makes the downloader start over): a copy missed leaves the stop to the guard, one
    counted twice could stop the server while a peer still needs it.
    """
    return status in (200, 206) and sent == length and last == size - 1


def entity_tag(info: os.stat_result) -> str:
    """A strong ETag: the downloader sends it back in If-Range, so bytes of a changed file are never spliced."""
    return '"%x-%x-%x"' % (info.st_ino, info.st_size, info.st_mtime_ns)


def connection_cap(requested: int, fd_limit: int) -> int:
    """Connections served at once: as asked, but never so many that accept() runs out of descriptors."""
    if fd_limit < 0:  # RLIM_INFINITY
        return max(1, requested)
    return max(1, min(requested, (fd_limit - FDS_KEPT_FREE) // 2))


class Limits(NamedTuple):
    idle_s: float = 0.0  # no connection open and none opened or closed for this long: stop (0: never)
    max_s: float = 0.0  # up this long: stop (0: never)
    linger_s: float = DONE_LINGER_S  # quiet this long after every expected copy was sent: stop


def stop_reason(now: float, started: float, last_activity: float, open_connections: int,
                all_copies_sent: bool, limits: Limits) -> Optional[str]:
    """Why the server should stop now, or None.

    The guard, like the link's and the forwarders': nothing happening for the quiet time means whoever
    started the server is gone. It counts from the start too, so a server nobody ever reaches stops as well.
    """
    if limits.max_s and now - started >= limits.max_s:
        return "up for %gs (--max-seconds)" % limits.max_s
    if open_connections:
        return None
    quiet = now - last_activity
    if all_copies_sent and quiet >= limits.linger_s:
        return "every expected copy was sent"
    if limits.idle_s and quiet >= limits.idle_s:
        return "no connection for %gs: the peers are done or gone (--idle-seconds)" % limits.idle_s
    return None


class Transfer:
    """The copies still owed and the connections open: what tells the server its work is over.

    Copies are only a hint to stop early, so they are counted low, never high. The peers cannot be
    told apart (through SSH they all come from the loopback), and bytes handed to the kernel may never
    reach a peer (a 200 whose tail is lost, then the peer's `bytes=K-`, both run to the end). So a file's
    expected copies are sent only once as many responses ran to its end (copy_completed) AND the bytes
    sent of it add up to that many whole files: nobody holds a copy with fewer bytes than the file's size,
    so a tail range (`bytes=-1`) or a resume after a lost tail cannot make up for a missing copy.
    """

    def __init__(self, expected: Mapping[str, int], clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.expected = Counter({name: count for name, count in expected.items() if count > 0})
        self.expects_copies = bool(self.expected)
        self.ends = Counter()  # type: Counter
        self.bytes_sent = Counter()  # type: Counter
        self.sizes = {}  # type: Dict[str, int]
        self.started = self.last_activity = clock()
        # Each open connection: the time by which its request head must be complete, None while it is
        # being answered. One past that time is no peer at work (a slowloris, a stalled client).
        self.connections = {}  # type: Dict[object, Optional[float]]
        self.lock = threading.Lock()

    @property
    def open_connections(self) -> int:
        with self.lock:
            return len(self.connections)

    def opened(self, key: object, head_deadline: Optional[float] = None) -> None:
        with self.lock:
            self.connections[key] = head_deadline
            self.last_activity = self.clock()

    def closed(self, key: object) -> None:
        with self.lock:
            self.connections.pop(key, None)
            self.last_activity = self.clock()

    def reading_head(self, key: object, deadline: Optional[float]) -> None:
        with self.lock:
            if key in self.connections:
                self.connections[key] = deadline

    def head_read(self, key: object) -> None:
        with self.lock:
            if key in self.connections:
                self.connections[key] = None
                self.last_activity = self.clock()

    def sent(self, name: str, size: int, sent: int, reached_end: bool) -> None:
        """A response of `name` (`size` bytes now): `sent` bytes handed to the kernel, ran to the end or not."""
        with self.lock:
            self.sizes[name] = size
            self.bytes_sent[name] += sent
            if reached_end:
                self.ends[name] += 1

    @property
    def owed(self) -> Counter:
        """The copies of each file not yet sent by the count above (0 for those that are)."""
        with self.lock:
            return Counter(self._owed())

    def _owed(self) -> Dict[str, int]:
        owed = {}
        for name, count in self.expected.items():
            size = self.sizes.get(name)
            if size is None:  # nothing of it sent yet
                owed[name] = count
                continue
            whole = self.bytes_sent[name] // size if size else self.ends[name]
            owed[name] = max(0, count - min(self.ends[name], whole))
        return owed

    def active_connections(self) -> int:
        with self.lock:
            return self._active(self.clock())

    def _active(self, now: float) -> int:
        return sum(1 for deadline in self.connections.values() if deadline is None or now < deadline)

    def stop_reason(self, limits: Limits) -> Optional[str]:
        with self.lock:
            now = self.clock()
            all_sent = self.expects_copies and not any(self._owed().values())
            return stop_reason(now, self.started, self.last_activity, self._active(now), all_sent, limits)


class HeadReader(io.RawIOBase):
    """The connection's reads: while a request head is awaited, each recv() waits only for what is left
    of the time the whole head has (a client dripping a byte at a time cannot hold a slot for ever)."""

    def __init__(self, handler: "Handler"):
        super().__init__()
        self.handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        connection, deadline = self.handler.connection, self.handler.head_deadline
        if deadline is None:
            return connection.recv_into(buffer)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("the request head was not complete within %gs" % self.handler.timeout)
        connection.settimeout(remaining)
        try:
            return connection.recv_into(buffer)
        finally:
            connection.settimeout(self.handler.timeout)


class Handler(BaseHTTPRequestHandler):
    server_version = "prima-range/1"
    protocol_version = "HTTP/1.1"
    # Seconds a connection may send or take nothing (a stalled peer, a half-sent request) before it is closed.
    timeout = CONNECTION_TIMEOUT_S

    head_deadline = None  # type: Optional[float]

    def setup(self):
        self.timeout = getattr(self.server, "connection_timeout", self.timeout)
        super().setup()
        self.rfile = io.BufferedReader(HeadReader(self))

    def handle_one_request(self):
        # The connection timeout is the time the whole request line and headers have, from the end of the
        # previous response (or the accept); writing a body keeps it per send().
        self.head_deadline = time.monotonic() + self.timeout if self.timeout else None
        self.server.transfer.reading_head(self.connection, self.head_deadline)
        super().handle_one_request()

    def parse_request(self):
        try:
            return super().parse_request()  # reads the headers
        finally:
            self.head_deadline = None
            self.server.transfer.head_read(self.connection)

    def do_HEAD(self):
        self._serve(send_body=False)

    def do_GET(self):
        self._serve(send_body=True)

    def _serve(self, send_body: bool) -> None:
        name = requested_name(self.path)
        if name is None or (self.server.files is not None and name not in self.server.files):
            self._refuse(404, "not served")
            return
        handle = open_regular(self.server.root, name)
        if handle is None:
            self._refuse(404, "missing, a symlink or not a regular file")
            return
        with handle:
            info = os.fstat(handle.fileno())
            size, etag = info.st_size, entity_tag(info)
            # RFC 9110: an If-Range that is not the file's current ETag asks for the whole file.
            if_range = self.headers.get("If-Range")
            range_header = self.headers.get("Range") if if_range in (None, etag) else None
            try:
                wanted = parse_range(range_header, size)
            except ValueError as error:
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % size)
                self.send_header("Content-Length", "0")
                self.end_headers()
                self._done(name, 416, -1, size, 0, 0, why=str(error))
                return
            first, last = wanted if wanted else (0, size - 1)
            length = last - first + 1
            status = 206 if wanted else 200
            self.send_response(status)
            if wanted:
                self.send_header("Content-Range", "bytes %d-%d/%d" % (first, last, size))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", etag)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(length))
            self.end_headers()
            sent, why = self._send_body(handle, first, length) if send_body else (0, None)
        self._done(name, status, last, size, sent, length, why)

    def _send_body(self, handle: BinaryIO, first: int, length: int) -> Tuple[int, Optional[str]]:
        """The bytes sent, and why they are fewer than `length` (then the connection is closed: the
        client must not wait for the rest of a keep-alive body that will never come)."""
        sent, why = 0, None
        try:
            handle.seek(first)
            while sent < length:
                chunk = handle.read(min(CHUNK, length - sent))
                if not chunk:
                    why = "the file ended %d bytes early (cut while served)" % (length - sent)
                    break
                self.wfile.write(chunk)
                sent += len(chunk)
        except OSError as error:  # the peer went away or stopped reading for longer than the timeout
            why = "sending failed: %r" % (error,)
        if sent < length:
            self.close_connection = True
            why = why or "body short"
        return sent, why

    def _done(self, name: str, status: int, last: int, size: int, sent: int, length: int,
              why: Optional[str] = None) -> None:
        if self.command == "GET" and status in (200, 206):
            self.server.transfer.sent(name, size, sent, copy_completed(status, last, size, sent, length))
        self._log(status, sent, size, why)

    def _refuse(self, status: int, why: str) -> None:
        body = b"not found\n"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self._log(status, 0, 0, why)

    def _log(self, status: int, sent: int, size: int, why: Optional[str] = None) -> None:
        range_header = self.headers.get("Range")
        record = {"time": round(time.time(), 3), "client": self.client_address[0],
                  "path": self.path[:LOGGED_CHARS], "status": status, "bytes": sent, "size": size,
                  "range": range_header[:LOGGED_CHARS] if range_header else range_header}
        if why:
            record["why"] = why
        self.server.write_log(record)

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


class FanoutServer(ThreadingHTTPServer):
    """A thread per connection, up to a cap; beyond it a connection gets 503 at once, and no thread."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: Tuple[str, int], root: str, files: Optional[Iterable[str]], log_path: str,
                 expected: Mapping[str, int], connection_timeout: float, max_connections: int,
                 on_bound: Optional[Callable[[], None]] = None):
        self.root = os.path.realpath(root)
        self.files = None if files is None else frozenset(files)
        self.log_path = log_path
        self.log_lock = threading.Lock()
        self.transfer = Transfer(expected)
        self.connection_timeout = connection_timeout
        self.max_connections = connection_cap(max_connections, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        self.slots = threading.BoundedSemaphore(self.max_connections)
        self.on_bound = on_bound
        super().__init__(address, Handler)

    def server_activate(self) -> None:
        # Bound (the port is this server's) and not yet listening: a peer that connects finds what on_bound did.
        if self.on_bound is not None:
            self.on_bound()
        super().server_activate()

    def write_log(self, record: Dict[str, object]) -> None:
        with self.log_lock:
            with open(self.log_path, "a") as handle:
                handle.write(json.dumps(record) + "\n")

    def handle_error(self, request, client_address):
        # A connection that broke outside the body (a reset during the headers): a line in the log, no traceback.
        self.write_log({"time": round(time.time(), 3), "client": client_address[0], "path": "", "range": None,
                        "status": 0, "bytes": 0, "size": 0, "why": "connection broke: %r" % (sys.exc_info()[1],)})

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            self._turn_away(request, client_address)
            return
        self.transfer.opened(request, time.monotonic() + self.connection_timeout if self.connection_timeout else None)
        try:
            threading.Thread(target=self.process_request_thread, args=(request, client_address),
                             daemon=True).start()
        except RuntimeError:  # no thread to be had: free what this connection holds
            self._release(request)

    def process_request_thread(self, request, client_address):
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self._release(request)

    def _release(self, request) -> None:
        self.shutdown_request(request)
        self.transfer.closed(request)
        self.slots.release()

    def _turn_away(self, request, client_address) -> None:
        # Non-blocking: the accept loop never waits on a client; the peers' downloader retries a 503.
        # What the client sent already is read first, or closing would reset the connection over the 503.
        request.setblocking(False)
        try:
            request.recv(65536)
        except OSError:
            pass
        try:
            request.send(BUSY_RESPONSE)
        except OSError:
            pass
        self.shutdown_request(request)
        self.write_log({"time": round(time.time(), 3), "client": client_address[0], "path": "", "range": None,
                        "status": 503, "bytes": 0, "size": 0,
                        "why": "%d connections open already" % self.max_connections})


def make_server(root: str, bind: str, port: int, log_path: str, files: Optional[Iterable[str]] = None,
                expected: Optional[Mapping[str, int]] = None, connection_timeout: float = CONNECTION_TIMEOUT_S,
                max_connections: int = MAX_CONNECTIONS,
                on_bound: Optional[Callable[[], None]] = None) -> FanoutServer:
    """A server of `files` (plain names) under root; files=None serves every non-hidden regular file below it.

    `expected`: copies of each file owed to the peers; see serve_until_done. `on_bound` runs once the port is
    bound, before the server listens.
    """
    expected = dict(expected or {})
    if files is not None:
        files = list(files)
        bad = [name for name in files if not plain_name(name)]
        if bad:
            raise ValueError("not plain file names (no '/', not hidden): %s" % ", ".join(map(repr, bad)))
        unknown = sorted(set(expected) - set(files))
        if unknown:
            raise ValueError("copies expected of files not served: %s" % ", ".join(unknown))
    return FanoutServer((bind, port), root, files, log_path, expected, connection_timeout, max_connections,
                        on_bound)


def serve_until_done(server: FanoutServer, limits: Limits, check_every: float = 0.5) -> str:
    """Serve until stop_reason gives a reason (the guard), and return it."""
    reasons = []

    def guard() -> None:
        while not reasons:
            time.sleep(check_every)
            reason = server.transfer.stop_reason(limits)
            if reason:
                reasons.append(reason)
                server.shutdown()

    threading.Thread(target=guard, daemon=True).start()
    server.serve_forever(poll_interval=min(check_every, 0.5))
    return reasons[0] if reasons else "shut down"


def write_pid_file(path: str) -> None:
    """Renamed into place, so a reader never finds it empty or half written."""
    partial = "%s.%d.partial" % (path, os.getpid())
    with open(partial, "w") as handle:
        handle.write("%d\n" % os.getpid())
    os.replace(partial, path)


def remove_pid_file(path: str) -> None:
    """Only while it still names this process: the play's pkill reads it."""
    try:
        with open(path) as handle:
            if handle.read().strip() == str(os.getpid()):
                os.remove(path)
    except OSError:
        pass


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="directory of the files")
    parser.add_argument("--file", dest="files", action="append", required=True, metavar="NAME",
                        help="a file served (a plain name under --root; repeat it); nothing else is")
    parser.add_argument("--expect", action="append", default=[], metavar="NAME",
                        help="one copy of NAME a peer needs (repeat it, once per peer): once every expected "
                             "copy was sent in full, the server stops")
    parser.add_argument("--bind", required=True, help="address to listen on (never 0.0.0.0 by default)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True, help="JSON lines, one per response")
    parser.add_argument("--pid-file", help="written whole once the port is bound, before it listens; removed on exit")
    parser.add_argument("--idle-seconds", type=float, default=0,
                        help="stop after this long with no connection, counted from the start (0: never)")
    parser.add_argument("--max-seconds", type=float, default=0, help="stop after this long (0: never)")
    parser.add_argument("--linger-seconds", type=float, default=DONE_LINGER_S,
                        help="once every expected copy was sent, stop after this long with no connection "
                             "(a peer between its retries must be back within it)")
    parser.add_argument("--connection-timeout", type=float, default=CONNECTION_TIMEOUT_S,
                        help="close a connection whose request line and headers take longer than this, or "
                             "that takes nothing of a response for this long")
    parser.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS,
                        help="connections served at once (fewer if the fd limit is low); more get 503")
    args = parser.parse_args(argv)
    # Once the port is this server's and before it listens: whoever reaches the port finds the file whole (the
    # play's pkill reads it), and a second server that cannot bind leaves the first one's file alone.
    on_bound = (lambda: write_pid_file(args.pid_file)) if args.pid_file else None
    try:
        try:
            server = make_server(args.root, args.bind, args.port, args.log, files=args.files,
                                 expected=Counter(args.expect), connection_timeout=args.connection_timeout,
                                 max_connections=args.max_connections, on_bound=on_bound)
        except ValueError as error:
            parser.error(str(error))
        try:
            reason = serve_until_done(server, Limits(args.idle_seconds, args.max_seconds, args.linger_seconds))
        finally:
            server.server_close()
    finally:
        if args.pid_file:
            remove_pid_file(args.pid_file)
    sys.stdout.write(json.dumps({"stopped": reason}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
