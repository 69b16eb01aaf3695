"""The load client (plugins/module_utils/load_client.py) against a scripted llama-server stand-in on loopback
that streams chat completion chunks: timing per event, concurrency, 401, a cut stream. The real llama-server is
loaded in the sandbox's serve tests; here only the client's own recording is checked."""

import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.prima.cluster.plugins.module_utils import load_client
from ansible_collections.prima.cluster.plugins.plugin_utils.bench import load_test

KEY = "serve-key"
# How long a trickling answer goes on at most (a byte every 0.1 s): far past the deadlines the tests give.
TRICKLE_S = 6.0
# Nested past what json's decoder takes (RecursionError, not ValueError).
NESTED = b"[" * 100000
# Long events: each a token, each half a MiB.
HUGE_EVENTS, HUGE_CONTENT = 30, 1 << 19


class Streamer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def trickle(self, head):
        """`head`, then a byte every 0.1 s, each well within any socket timeout, for TRICKLE_S at most."""
        try:
            self.wfile.write(head)
            for dummy in range(int(TRICKLE_S / 0.1)):
                time.sleep(0.1)
                self.wfile.write(b"x")
        except OSError:
            pass  # the client has gone

    def answer(self, payload, content_type="application/json"):
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

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
            if "TRICKLEBODY" in words:
                return self.trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{")
            if "NEST" in words:
                return self.answer(NESTED)
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
        if "TRICKLEHEAD" in words:
            return self.trickle(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        words = body["messages"][0]["content"].split()
        self.wfile.write(b": ping\n\n")
        if "TRICKLELINE" in words:
            return self.trickle(b"data: ")
        if "NEST" in words:
            self.wfile.write(b"data: " + NESTED + b"\n\n")
        if "HUGE" in words:
            words = ["x" * HUGE_CONTENT] * HUGE_EVENTS
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
    figures = load_test.stream_figures(record["sent"], record["arrivals"])
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
    summary = load_test.level_summary(4, [load_test.stream_figures(r["sent"], r["arrivals"])
                                          for r in level["requests"]], level["wall_s"])
    assert summary["errors"] == 0 and summary["tokens"] == 80 and summary["aggregate_tps"] > 0


def test_a_missing_key_and_a_cut_stream_are_errors(server):
    refused = load_client.one_request("127.0.0.1", server, "", load_client.chat_body("a", 4, True), 10)
    assert refused["status"] == 401 and refused["error"].startswith("HTTP 401: ")
    cut = load_client.one_request("127.0.0.1", server, KEY, load_client.chat_body("a b CUT c", 8, True), 10)
    figures = load_test.stream_figures(cut["sent"], cut["arrivals"])
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


def timed(call, *args, **kwargs):
    started = time.monotonic()
    return call(*args, **kwargs), time.monotonic() - started


@pytest.mark.parametrize("prompt", ["TRICKLEHEAD", "a TRICKLELINE"])
def test_a_streamed_request_ends_at_its_deadline_whatever_the_server_trickles(server, prompt):
    # A byte every 0.1 s: each read is well within the socket's timeout, the answer never ends.
    record, took = timed(load_client.one_request, "127.0.0.1", server, KEY, load_client.chat_body(prompt, 8, True), 1)
    assert record["error"] == "no complete answer within 1 s" and 1.0 <= took < 2.0
    assert record["done"] - record["sent"] < 2.0


def test_a_non_streamed_request_ends_at_its_deadline_whatever_the_server_trickles(server):
    record, took = timed(load_client.complete, "127.0.0.1", server, KEY, load_client.completion_body("TRICKLEBODY", 8),
                         1)
    assert record["error"] == "no complete answer within 1 s" and record["status"] == 200 and 1.0 <= took < 2.0


def test_json_nested_too_deep_is_an_answer_not_json_and_no_client_dies(server):
    level = load_client.run_level("127.0.0.1", server, KEY, clients=2, requests_per_client=1, prompt="NEST a b",
                                  max_tokens=8, timeout_s=10)
    # Every request of the level is recorded: the nested event is kept as the text it was, the tokens count.
    assert len(level["requests"]) == 2
    for record in level["requests"]:
        figures = load_test.request_figures(record)
        assert record["error"] is None and figures["tokens"] == 3 and figures["error"] is None
        assert record["arrivals"][0][1] == NESTED.decode()
    record = load_client.complete("127.0.0.1", server, KEY, load_client.completion_body("NEST", 8), 10)
    assert record["error"] == "the answer is not a JSON object: " + "[" * 300 and record["timings"] is None


def test_any_exception_of_a_request_is_its_error(server, monkeypatch):
    def broken(self, *args, **kwargs):
        raise RuntimeError("a fault of the client's own " * 20)

    monkeypatch.setattr(http.client.HTTPConnection, "request", broken)
    for record in (load_client.one_request("127.0.0.1", server, KEY, load_client.chat_body("a", 4, True), 10),
                   load_client.complete("127.0.0.1", server, KEY, load_client.completion_body("a", 4), 10)):
        assert record["error"].startswith("RuntimeError: a fault of the client's own") and record["done"] is not None
        assert len(record["error"]) == load_client.SHORT


def test_long_events_are_kept_as_their_length_within_a_byte_budget(server):
    record = load_client.one_request("127.0.0.1", server, KEY, load_client.chat_body("HUGE", 64, True), 10)
    assert record["error"] is None and record["dropped"] == 0
    # 30 events of half a MiB came; what goes back is the budget's worth at most, plus a few bytes per event.
    assert len(json.dumps(record)) < HUGE_EVENTS * HUGE_CONTENT // 1000
    assert HUGE_EVENTS * HUGE_CONTENT // 1000 < load_client.MAX_KEPT_BYTES
    assert record["arrivals"][1][1] == {"content_length": HUGE_CONTENT}
    figures = load_test.request_figures(record)
    assert figures["tokens"] == HUGE_EVENTS and len(figures["itl_ms"]) == HUGE_EVENTS - 1
    assert figures["server"]["eval_runs"] == HUGE_EVENTS and figures["server"]["eval_tps"] == 50.0


def test_past_the_byte_budget_events_are_digests_with_the_latest_timings_and_the_first_error():
    kept = load_client.Arrivals(max_events=4, max_bytes=60)
    whole = {"choices": [{"delta": {"content": "ab"}}]}
    kept.add(1.0, whole, 40)
    kept.add(2.0, dict(whole, timings={"predicted_n": 1}), 60)
    kept.add(3.0, {"error": {"message": "x" * 5000}}, 5100)
    kept.add(4.0, dict(whole, timings={"predicted_n": 2}, error="later"), 60)
    assert [event for dummy, event in kept.items] == [
        whole, {"content_length": 2}, {"content_length": 0, "error": json.dumps({"message": "x" * 5000})[:300]},
        {"content_length": 2, "timings": {"predicted_n": 2}}]
    # Past max_events the last slot takes each event; the budget counts what it held.
    kept.add(5.0, whole, 40)
    assert kept.items[-1] == [5.0, {"content_length": 2}] and kept.dropped == 1
    assert kept.size == len(json.dumps(whole)) and kept.timings_at is None
