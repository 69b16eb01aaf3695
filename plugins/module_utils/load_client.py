"""Load a llama-server the way chat users do: concurrent streamed chat completions, each event timed.

Node-side (rank 0, over loopback by default), Python 3.8, standard library only (http.client). It only
records: when each request was sent, when each server-sent event arrived (one monotonic clock), the events
decoded, and what went wrong. The figures (TTFT, ITL, percentiles) are computed on the controller
(plugin_utils/loadtest.py).
"""

import http.client
import json
import threading
import time
from typing import Any, Dict, List, Optional

# One event line is a token's chunk, a few hundred bytes; a line past this is not llama-server talking.
MAX_LINE = 1 << 20
MAX_EVENTS = 100000


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
    return "HTTP %d: %s" % (status, body[:300].decode("utf-8", "replace").replace("\n", " "))


def one_request(host: str, port: int, api_key: str, body: bytes, timeout_s: float,
                clock=time.monotonic, max_events: int = MAX_EVENTS) -> Dict[str, Any]:
    """One streamed chat completion: {sent, done, status, arrivals: [[t, event]], dropped, error}.

    At most `max_events` arrivals are kept, so that what goes back to the controller stays bounded: past that the
    stream is still read to its end (the request's wall time stays true), each later event takes the last slot
    (the final chunk, with the server's `timings`, is kept) and `dropped` counts the events overwritten."""
    record = {"sent": None, "done": None, "status": None, "arrivals": [], "dropped": 0,
              "error": None}  # type: Dict[str, Any]
    headers = _headers(api_key, True)
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    deadline = None  # type: Optional[float]
    try:
        record["sent"] = clock()
        deadline = record["sent"] + timeout_s
        connection.request("POST", "/v1/chat/completions", body=body, headers=headers)
        response = connection.getresponse()
        record["status"] = response.status
        if response.status != 200:
            record["error"] = http_error(response.status, response.read(300))
            return record
        while True:
            line = response.readline(MAX_LINE)
            now = clock()
            if not line:
                record["error"] = "the stream ended before [DONE], after %d events" % len(record["arrivals"])
                break
            if now > deadline:
                record["error"] = "no complete answer within %.0f s" % timeout_s
                break
            text = line.decode("utf-8", "replace").rstrip("\r\n")
            if not text.startswith("data:"):
                continue
            payload = text[5:].strip()
            if payload == "[DONE]":
                break
            try:
                event = json.loads(payload)  # type: Any
            except ValueError:
                event = payload
            if len(record["arrivals"]) < max(1, max_events):
                record["arrivals"].append([now, event])
            else:
                record["arrivals"][-1] = [now, event]
                record["dropped"] += 1
    except (OSError, http.client.HTTPException) as error:
        record["error"] = "%s: %s" % (type(error).__name__, error)
    finally:
        record["done"] = clock()
        connection.close()
    return record


def complete(host: str, port: int, api_key: str, body: bytes, timeout_s: float,
             clock=time.monotonic) -> Dict[str, Any]:
    """One non-streamed /completion (body: completion_body): {sent, done, status, timings, usage, error}. Only the
    server's own `timings` and the token counts of the answer are kept (the text is not needed and could be long)."""
    record = {"sent": None, "done": None, "status": None, "timings": None, "usage": None,
              "error": None}  # type: Dict[str, Any]
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        record["sent"] = clock()
        connection.request("POST", "/completion", body=body, headers=_headers(api_key, False))
        response = connection.getresponse()
        record["status"] = response.status
        text = response.read(MAX_LINE)
        if response.status != 200:
            record["error"] = http_error(response.status, text)
            return record
        try:
            answer = json.loads(text.decode("utf-8", "replace"))  # type: Any
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            record["error"] = "the answer is not a JSON object: %s" % text[:300].decode("utf-8", "replace")
        elif not isinstance(answer.get("timings"), dict):
            record["error"] = "the answer has no timings: %s" % json.dumps(answer, sort_keys=True)[:300]
        else:
            record["timings"] = answer["timings"]
            record["usage"] = {"prompt_tokens": answer.get("tokens_evaluated"),
                               "completion_tokens": answer.get("tokens_predicted")}
    except (OSError, http.client.HTTPException) as error:
        record["error"] = "%s: %s" % (type(error).__name__, error)
    finally:
        record["done"] = clock()
        connection.close()
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
