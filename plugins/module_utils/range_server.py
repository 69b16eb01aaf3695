"""Serve a directory read-only over HTTP with Range requests, logging every response.

Used as the cluster's fan-out source (one node serves the weights it fetched to the
others) and as the sandbox's stand-in for the Hugging Face hub. Standard library only,
Python 3.8 compatible: it runs on the nodes.
"""

import argparse
import json
import os
import posixpath
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional, Tuple
from urllib.parse import unquote, urlsplit

CHUNK = 1 << 20
RANGE_PATTERN = re.compile(r"^bytes=(\d*)-(\d*)$")


def parse_range(header: Optional[str], size: int) -> Optional[Tuple[int, int]]:
    """(first, last) inclusive for a single `bytes=` range; None for no or unusable Range.

    Raises ValueError for a range that starts past the end (answered with 416).
    """
    if not header:
        return None
    match = RANGE_PATTERN.match(header.strip())
    if not match or (match.group(1) == "" and match.group(2) == ""):
        return None
    first_text, last_text = match.groups()
    if first_text == "":
        length = int(last_text)
        if length == 0:
            raise ValueError("empty suffix range")
        return max(size - length, 0), size - 1
    first = int(first_text)
    last = int(last_text) if last_text else size - 1
    if first >= size:
        raise ValueError("range starts past the end")
    return first, min(last, size - 1)


def resolve(root: str, url_path: str) -> Optional[str]:
    """The file under root that the URL path names; None if it escapes root."""
    path = posixpath.normpath(unquote(urlsplit(url_path).path))
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if any(part == ".." for part in parts):
        return None
    return os.path.join(root, *parts)


class Handler(BaseHTTPRequestHandler):
    server_version = "prima-range/1"
    protocol_version = "HTTP/1.1"

    def do_HEAD(self):
        self._serve(send_body=False)

    def do_GET(self):
        self._serve(send_body=True)

    def _serve(self, send_body: bool) -> None:
        path = resolve(self.server.root, self.path)
        if path is None or not os.path.isfile(path):
            self._finish(404, b"not found\n", sent=0)
            return
        size = os.path.getsize(path)
        try:
            wanted = parse_range(self.headers.get("Range"), size)
        except ValueError:
            self.send_response(416)
            self.send_header("Content-Range", "bytes */%d" % size)
            self.send_header("Content-Length", "0")
            self.end_headers()
            self._log(416, 0, size)
            return
        first, last = wanted if wanted else (0, size - 1)
        length = last - first + 1 if size else 0
        self.send_response(206 if wanted else 200)
        if wanted:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (first, last, size))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.end_headers()
        sent = 0
        if send_body:
            try:
                with open(path, "rb") as handle:
                    handle.seek(first)
                    while sent < length:
                        chunk = handle.read(min(CHUNK, length - sent))
                        if not chunk:
                            break
                        self.wfile.write(chunk)
                        sent += len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
        self._log(206 if wanted else 200, sent, size)

    def _finish(self, status: int, body: bytes, sent: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self._log(status, sent, 0)

    def _log(self, status: int, sent: int, size: int) -> None:
        record = {"time": round(time.time(), 3), "client": self.client_address[0], "path": self.path,
                  "range": self.headers.get("Range"), "status": status, "bytes": sent, "size": size}
        with self.server.log_lock:
            with open(self.server.log_path, "a") as handle:
                handle.write(json.dumps(record) + "\n")

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


def make_server(root: str, bind: str, port: int, log_path: str) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((bind, port), Handler)
    server.daemon_threads = True
    server.root = os.path.abspath(root)
    server.log_path = log_path
    server.log_lock = threading.Lock()
    return server


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="directory to serve")
    parser.add_argument("--bind", required=True, help="address to listen on (never 0.0.0.0 by default)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True, help="JSON lines, one per response")
    parser.add_argument("--pid-file", help="written once listening")
    parser.add_argument("--max-seconds", type=float, default=0, help="stop after this long (0: never)")
    args = parser.parse_args(argv)
    server = make_server(args.root, args.bind, args.port, args.log)
    if args.pid_file:
        with open(args.pid_file, "w") as handle:
            handle.write("%d\n" % os.getpid())
    if args.max_seconds > 0:
        timer = threading.Timer(args.max_seconds, server.shutdown)
        timer.daemon = True
        timer.start()
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
