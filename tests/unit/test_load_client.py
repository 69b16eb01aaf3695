"""The load client (plugins/module_utils/load_client.py) against a scripted llama-server stand-in on loopback
that streams chat completion chunks: timing per event, concurrency, 401, a cut stream. The real llama-server is
loaded in the sandbox's serve tests; here only the client's own recording is checked."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.prima.cluster.plugins.module_utils import load_client
from ansible_collections.prima.cluster.plugins.plugin_utils import loadtest

KEY = "serve-key"


class Streamer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.headers.get("Authorization") != "Bearer " + KEY:
            payload = b'{"error": {"code": 401, "message": "Invalid API Key"}}'
            self.send_response(401)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        if self.path == "/completion":  # llama-server's own endpoint, the non-streamed requests'
            words = body["prompt"].split()
            answer = {"content": " ".join(words), "tokens_predicted": len(words), "tokens_evaluated": 2}
            if "NOTIMINGS" not in words:
                answer["timings"] = {"predicted_n": len(words), "predicted_per_second": 50.0}
            payload = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        words = body["messages"][0]["content"].split()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        words = body["messages"][0]["content"].split()
        self.wfile.write(b": ping\n\n")
        for word in words[:body["max_tokens"]]:
            if word == "CUT":
                return
            chunk = {"choices": [{"delta": {"content": word}}]}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
            time.sleep(0.02)
        final = {"choices": [{"delta": {}}], "timings": {"predicted_n": len(words), "predicted_per_second": 50.0}}
        self.wfile.write(b"data: " + json.dumps(final).encode() + b"\n\ndata: [DONE]\n\n")


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Streamer)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def test_one_streamed_request_is_timed_per_event(server):
    record = load_client.one_request("127.0.0.1", server, KEY, load_client.chat_body("a b c d", 8, True), 10)
    assert record["status"] == 200 and record["error"] is None
    figures = loadtest.stream_figures(record["sent"], record["arrivals"])
    assert figures["tokens"] == 4 and figures["ttft_ms"] > 0 and len(figures["itl_ms"]) == 3
    # Arrival times, not the server's pacing: a busy client may read two chunks back to back.
    assert all(gap >= 0 for gap in figures["itl_ms"]) and sorted(t for t, dummy in record["arrivals"]) == [
        t for t, dummy in record["arrivals"]]
    assert figures["server"]["eval_tps"] == 50.0


def test_a_level_runs_its_clients_at_once(server):
    level = load_client.run_level("127.0.0.1", server, KEY, clients=4, requests_per_client=2,
                                  prompt="w " * 10, max_tokens=10, timeout_s=10)
    assert len(level["requests"]) == 8 and level["clients"] == 4
    # Four at once: about two requests' time (2 x 10 x 20 ms), well under eight one after another.
    assert level["wall_s"] < 8 * 10 * 0.02
    summary = loadtest.level_summary(4, [loadtest.stream_figures(r["sent"], r["arrivals"]) for r in level["requests"]],
                                     level["wall_s"])
    assert summary["errors"] == 0 and summary["tokens"] == 80 and summary["aggregate_tps"] > 0


def test_a_missing_key_and_a_cut_stream_are_errors(server):
    refused = load_client.one_request("127.0.0.1", server, "", load_client.chat_body("a", 4, True), 10)
    assert refused["status"] == 401 and refused["error"].startswith("HTTP 401: ")
    cut = load_client.one_request("127.0.0.1", server, KEY, load_client.chat_body("a b CUT c", 8, True), 10)
    figures = loadtest.stream_figures(cut["sent"], cut["arrivals"])
    assert figures["tokens"] == 2 and cut["error"] == "the stream ended before [DONE], after 2 events"
    closed = load_client.one_request("127.0.0.1", 1, KEY, load_client.chat_body("a", 4, True), 2)
    assert closed["error"].startswith("ConnectionRefusedError")


def test_every_request_asks_for_the_whole_prompt_evaluated():
    body = json.loads(load_client.chat_body("Hello", 8, False))
    assert body["cache_prompt"] is False and body["stream"] is False and body["max_tokens"] == 8
    body = json.loads(load_client.completion_body("Hello", 8))
    assert body == {"prompt": "Hello", "n_predict": 8, "stream": False, "temperature": 0, "cache_prompt": False}


def test_a_non_streamed_request_keeps_the_servers_timings(server):
    record = load_client.complete("127.0.0.1", server, KEY, load_client.completion_body("a b c", 8), 10)
    assert record["status"] == 200 and record["error"] is None and record["done"] >= record["sent"]
    assert record["timings"] == {"predicted_n": 3, "predicted_per_second": 50.0}
    assert record["usage"] == {"prompt_tokens": 2, "completion_tokens": 3} and "content" not in record
    missing = load_client.complete("127.0.0.1", server, KEY, load_client.completion_body("a NOTIMINGS", 8), 10)
    assert missing["timings"] is None and missing["error"].startswith("the answer has no timings: {")
    refused = load_client.complete("127.0.0.1", server, "wrong", load_client.completion_body("a", 4), 10)
    assert refused["status"] == 401 and refused["error"] == 'HTTP 401: {"error": {"code": 401, "message": "Invalid API Key"}}'
    closed = load_client.complete("127.0.0.1", 1, KEY, load_client.completion_body("a", 4), 2)
    assert closed["error"].startswith("ConnectionRefusedError") and closed["status"] is None


def test_the_events_kept_are_capped_and_the_last_one_kept(server):
    record = load_client.one_request("127.0.0.1", server, KEY, load_client.chat_body("a b c d e f", 8, True), 10,
                                     max_events=3)
    # Read to [DONE] all the same: 6 content chunks and the final one, 3 kept, the final chunk (timings) last.
    assert record["error"] is None and len(record["arrivals"]) == 3 and record["dropped"] == 4
    contents = [event["choices"][0]["delta"]["content"] for dummy, event in record["arrivals"][:2]]
    assert "timings" in record["arrivals"][-1][1] and contents == ["a", "b"]
    level = load_client.run_level("127.0.0.1", server, KEY, clients=2, requests_per_client=1, prompt="a b c d",
                                  max_tokens=8, timeout_s=10, max_events=2)
    assert all(len(request["arrivals"]) == 2 and request["dropped"] == 3 for request in level["requests"])
