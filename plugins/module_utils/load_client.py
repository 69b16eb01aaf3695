"""Load a llama-server the way chat users do: concurrent streamed chat completions, each event timed.

Node-side (rank 0, over loopback by default), Python 3.8, standard library only (http.client). It only
records: when each request was sent, when each server-sent event arrived (one monotonic clock), the events
decoded, and what went wrong. The figures (TTFT, ITL, percentiles) are computed on the controller
(plugin_utils/bench/load_test.py).
"""

import http.client
import json
import socket
import threading
import time
from typing import Any, Dict, List, Optional

# One event line is a token's chunk, a few hundred bytes; a line past this is not llama-server talking.
MAX_LINE = 1 << 20
MAX_EVENTS = 100000
# Bytes of events kept whole per streamed request (about a thousand chunks); past them each event is kept as its
# digest, what the figures need of it, so that a server's long lines cannot swell what goes back to the controller.
MAX_KEPT_BYTES = 1 << 18
# A digest's count of content characters: the key that tells a digest from an event as the server sent it.
DIGEST_KEY = "content_length"
# Timings or an error longer than this are not a llama-server's: the start of their JSON is kept instead.
MAX_PART_BYTES = 4096
SHORT = 300


def chat_body(prompt: str, max_tokens: int, stream: bool, model: str = "default") -> bytes:
    # cache_prompt off: llama-server would otherwise reuse a slot's cache of the same prompt and evaluate one token
    # of it, and every request here sends the same prompt; a benchmark's prompt figures need the whole prompt.
    return json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "stream": stream, "temperature": 0, "cache_prompt": False}).encode("utf-8")


def completion_body(prompt: str, max_tokens: int) -> bytes:
    """A non-streamed request to llama-server's own /completion: the one endpoint whose answer carries `timings` in
    both servers (prima.cpp's llama-server at its pinned commit gives none with a chat completion)."""
    return json.dumps({"prompt": prompt, "n_predict": max_tokens, "stream": False, "temperature": 0,
                       "cache_prompt": False}).encode("utf-8")


def _headers(api_key: str, stream: bool) -> Dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream" if stream else "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    return headers


def http_error(status: int, body: bytes) -> str:
    """A refused request in one line: its status and the start of what the server said."""
    return "HTTP %d: %s" % (status, body[:SHORT].decode("utf-8", "replace").replace("\n", " "))


def failure(error: BaseException) -> str:
    """An exception as a request's error: its type and the start of its message."""
    return ("%s: %s" % (type(error).__name__, error))[:SHORT]


def timed_out(timeout_s: float) -> str:
    return "no complete answer within %g s" % timeout_s


class Watchdog:
    """Shuts a socket down at a deadline. A socket timeout bounds each read, not the answer: a server that
    trickles a byte within each would hold a request for as long as it likes, in the headers too (http.client
    reads them line by line). Shutdown, unlike close, also ends a read under way in another thread."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self.fired = threading.Event()
        self._timer = threading.Timer(max(0.0, seconds), self._shut, [sock])
        self._timer.daemon = True
        self._timer.start()

    def _shut(self, sock: socket.socket) -> None:
        self.fired.set()
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # closed already: the answer came first

    def stop(self) -> bool:
        """Whether it cut the answer. Joined, so that it cannot shut the socket down as it is being closed."""
        self._timer.cancel()
        self._timer.join()
        return self.fired.is_set()


def delta_text(event: Any) -> str:
    """The content a chat completion chunk adds ("" for role-only, final or malformed chunks)."""
    if not isinstance(event, dict):
        return ""
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    delta = choices[0].get("delta")
    content = delta.get("content") if isinstance(delta, dict) else None
    return content if isinstance(content, str) else ""


def json_size(value: Any) -> int:
    return len(json.dumps(value))


def small(value: Any) -> Any:
    """`value` when its JSON is short, else the start of its JSON."""
    text = json.dumps(value, sort_keys=True)
    return value if len(text) <= MAX_PART_BYTES else text[:SHORT]


def decode(text: str) -> Any:
    """JSON as decoded, None when it is not JSON (nested too deep for the decoder included)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


class Arrivals:
    """The events kept of one stream, [[time, event]], bounded in number (`max_events`: past it each later event
    takes the last slot, so the final chunk with the server's `timings` is kept, and `dropped` counts the events
    overwritten) and in bytes (`max_bytes` of events kept whole; past it an event is kept as its digest:
    {DIGEST_KEY: its content's length}, with its timings when they are the latest, its error when the first)."""

    def __init__(self, max_events: int, max_bytes: int = MAX_KEPT_BYTES) -> None:
        self.items = []  # type: List[List[Any]]
        self.dropped = 0
        self.max_events, self.max_bytes = max(1, max_events), max_bytes
        self.size = 0  # bytes of the events kept whole
        self.last_size = 0  # of them, the last slot's
        self.timings_at = None  # type: Optional[int]  # the digest that holds the latest timings
        self.error_kept = False

    def digest(self, event: Any) -> Dict[str, Any]:
        kept = {DIGEST_KEY: len(delta_text(event))}  # type: Dict[str, Any]
        if isinstance(event, dict) and "timings" in event:
            kept["timings"] = small(event["timings"])
        if isinstance(event, dict) and event.get("error") and not self.error_kept:
            kept["error"] = small(event["error"])
            self.error_kept = True
        return kept

    def add(self, when: float, event: Any, line_bytes: int) -> None:
        if len(self.items) >= self.max_events:  # the last slot takes it
            self.size -= self.last_size
            self.dropped += 1
            if self.timings_at == len(self.items) - 1:
                self.timings_at = None
            self.items.pop()
        room = self.max_bytes - self.size
        # The line's length first: a long line is not encoded only to be found too long.
        size = json_size(event) if line_bytes <= room else room + 1
        if size <= room:
            self.items.append([when, event])
            self.size += size
            self.last_size = size
            return
        kept = self.digest(event)
        self.last_size = 0
        if "timings" in kept:
            if self.timings_at is not None:
                self.items[self.timings_at][1].pop("timings", None)
            self.timings_at = len(self.items)
        self.items.append([when, kept])


def one_request(host: str, port: int, api_key: str, body: bytes, timeout_s: float,
                clock=time.monotonic, max_events: int = MAX_EVENTS) -> Dict[str, Any]:
    """One streamed chat completion: {sent, done, status, arrivals: [[t, event]], dropped, error}, within
    `timeout_s` all told (connecting, headers, every event). The arrivals kept are bounded (Arrivals): the
    stream is still read to its end, so the request's wall time stays true. Whatever goes wrong is the request's
    error, never an exception: a client thread that died would leave its requests out of the level."""
    record = {"sent": None, "done": None, "status": None, "arrivals": [], "dropped": 0,
              "error": None}  # type: Dict[str, Any]
    arrivals = Arrivals(max_events)
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    watchdog = None  # type: Optional[Watchdog]
    cut = False
    try:
        record["sent"] = clock()
        deadline = record["sent"] + timeout_s
        connection.connect()
        watchdog = Watchdog(connection.sock, deadline - clock())
        connection.request("POST", "/v1/chat/completions", body=body, headers=_headers(api_key, True))
        response = connection.getresponse()
        record["status"] = response.status
        if response.status != 200:
            record["error"] = http_error(response.status, response.read(SHORT))
            return record
        while True:
            line = response.readline(MAX_LINE)
            now = clock()
            if now > deadline:
                record["error"] = timed_out(timeout_s)
                break
            if not line:
                record["error"] = "the stream ended before [DONE], after %d events" % (
                    len(arrivals.items) + arrivals.dropped)
                break
            text = line.decode("utf-8", "replace").rstrip("\r\n")
            if not text.startswith("data:"):
                continue
            payload = text[5:].strip()
            if payload == "[DONE]":
                break
            event = decode(payload)
            arrivals.add(now, payload if event is None else event, len(line))
    except Exception as error:  # pylint: disable=broad-except  # see the docstring
        record["error"] = failure(error)
    finally:
        cut = watchdog is not None and watchdog.stop()
        record["done"] = clock()
        connection.close()
        record["arrivals"], record["dropped"] = arrivals.items, arrivals.dropped
        if cut and record["error"]:
            record["error"] = timed_out(timeout_s)
    return record


def complete(host: str, port: int, api_key: str, body: bytes, timeout_s: float,
             clock=time.monotonic) -> Dict[str, Any]:
    """One non-streamed /completion (body: completion_body): {sent, done, status, timings, usage, error}, within
    `timeout_s` all told. Only the server's own `timings` and the token counts of the answer are kept (the text is
    not needed and could be long); whatever goes wrong is the request's error, never an exception."""
    record = {"sent": None, "done": None, "status": None, "timings": None, "usage": None,
              "error": None}  # type: Dict[str, Any]
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    watchdog = None  # type: Optional[Watchdog]
    cut = False
    try:
        record["sent"] = clock()
        connection.connect()
        watchdog = Watchdog(connection.sock, record["sent"] + timeout_s - clock())
        connection.request("POST", "/completion", body=body, headers=_headers(api_key, False))
        response = connection.getresponse()
        record["status"] = response.status
        text = response.read(MAX_LINE)
        if watchdog.fired.is_set():
            record["error"] = timed_out(timeout_s)
            return record
        if response.status != 200:
            record["error"] = http_error(response.status, text)
            return record
        answer = decode(text.decode("utf-8", "replace"))
        if not isinstance(answer, dict):
            record["error"] = "the answer is not a JSON object: %s" % text[:SHORT].decode("utf-8", "replace")
        elif not isinstance(answer.get("timings"), dict):
            record["error"] = "the answer has no timings: %s" % json.dumps(answer, sort_keys=True)[:SHORT]
        elif json_size(answer["timings"]) > MAX_PART_BYTES:
            record["error"] = "the answer's timings take %d bytes, not a llama-server's" % json_size(answer["timings"])
        else:
            record["timings"] = answer["timings"]
            record["usage"] = {"prompt_tokens": small(answer.get("tokens_evaluated")),
                               "completion_tokens": small(answer.get("tokens_predicted"))}
    except Exception as error:  # pylint: disable=broad-except  # see the docstring
        record["error"] = failure(error)
    finally:
        cut = watchdog is not None and watchdog.stop()
        record["done"] = clock()
        connection.close()
        if cut and record["error"]:
            record["error"] = timed_out(timeout_s)
    return record


def run_level(host: str, port: int, api_key: str, clients: int, requests_per_client: int, prompt: str,
              max_tokens: int, timeout_s: float, max_events: int = MAX_EVENTS) -> Dict[str, Any]:
    """`clients` threads, each sending its requests one after another: {clients, wall_s, requests: [...]}."""
    body = chat_body(prompt, max_tokens, True)
    results = []  # type: List[Dict[str, Any]]
    lock = threading.Lock()

    def client() -> None:
        for dummy in range(requests_per_client):
            record = one_request(host, port, api_key, body, timeout_s, max_events=max_events)
            with lock:
                results.append(record)

    threads = [threading.Thread(target=client, name="load-client-%d" % index) for index in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"clients": clients, "wall_s": time.monotonic() - started, "requests": results}
