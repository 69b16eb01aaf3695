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
    return json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "stream": stream, "temperature": 0}).encode("utf-8")


def one_request(host: str, port: int, api_key: str, body: bytes, timeout_s: float,
                clock=time.monotonic) -> Dict[str, Any]:
    """One streamed chat completion: {sent, done, status, arrivals: [[t, event]], error}."""
    record = {"sent": None, "done": None, "status": None, "arrivals": [], "error": None}  # type: Dict[str, Any]
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    deadline = None  # type: Optional[float]
    try:
        record["sent"] = clock()
        deadline = record["sent"] + timeout_s
        connection.request("POST", "/v1/chat/completions", body=body, headers=headers)
        response = connection.getresponse()
        record["status"] = response.status
        if response.status != 200:
            record["error"] = "HTTP %d: %s" % (response.status, response.read(300).decode("utf-8", "replace")
                                               .replace("\n", " "))
            return record
        while len(record["arrivals"]) < MAX_EVENTS:
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
            record["arrivals"].append([now, event])
    except (OSError, http.client.HTTPException) as error:
        record["error"] = "%s: %s" % (type(error).__name__, error)
    finally:
        record["done"] = clock()
        connection.close()
    return record


def run_level(host: str, port: int, api_key: str, clients: int, requests_per_client: int, prompt: str,
              max_tokens: int, timeout_s: float) -> Dict[str, Any]:
    """`clients` threads, each sending its requests one after another: {clients, wall_s, requests: [...]}."""
    body = chat_body(prompt, max_tokens, True)
    results = []  # type: List[Dict[str, Any]]
    lock = threading.Lock()

    def client() -> None:
        for dummy in range(requests_per_client):
            record = one_request(host, port, api_key, body, timeout_s)
            with lock:
                results.append(record)

    threads = [threading.Thread(target=client, name="load-client-%d" % index) for index in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"clients": clients, "wall_s": time.monotonic() - started, "requests": results}
