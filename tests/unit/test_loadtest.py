"""The load test's figures (plugins/plugin_utils/bench/load_test.py): SSE parsing, TTFT and ITL, percentiles, levels."""

import json

import pytest

from ansible_collections.prima.cluster.plugins.plugin_utils.bench import load_test


def chunk(text=None, **extra):
    delta = {"content": text} if text is not None else {"role": "assistant"}
    return dict({"choices": [{"index": 0, "delta": delta}], "object": "chat.completion.chunk"}, **extra)


def test_sse_data_stops_at_done_and_keeps_what_is_not_json():
    lines = [": keep-alive", "", "data: " + json.dumps(chunk()), "event: x", "data: " + json.dumps(chunk("Hi")),
             "data: {broken", "data: [DONE]", "data: " + json.dumps(chunk("after"))]
    events = load_test.sse_data(lines)
    assert events == [chunk(), chunk("Hi"), "{broken"]


def test_stream_figures():
    timings = {"prompt_n": 12, "prompt_ms": 30.0, "prompt_per_second": 400.0, "predicted_n": 3,
               "predicted_ms": 60.0, "predicted_per_second": 50.0}
    arrivals = [(10.0, chunk()), (10.25, chunk("a")), (10.27, chunk("b")), (10.30, chunk("c")),
                (10.31, chunk("", timings=timings))]
    figures = load_test.stream_figures(10.0, arrivals)
    assert figures["ttft_ms"] == pytest.approx(250.0)
    assert figures["itl_ms"] == pytest.approx([20.0, 30.0])
    assert figures["tokens"] == 3 and figures["error"] is None
    assert figures["server"]["eval_tps"] == 50.0 and figures["server"]["prompt_tokens"] == 12


@pytest.mark.parametrize("arrivals, needle", [
    ([], "no content in 0 events"),
    ([(1.0, chunk()), (1.1, "not json")], "no content in 2 events"),
    ([(1.0, {"error": {"code": 500, "message": "boom"}})], "the server sent an error event"),
])
def test_a_stream_without_tokens_is_an_error(arrivals, needle):
    figures = load_test.stream_figures(0.0, arrivals)
    assert needle in figures["error"] and figures["ttft_ms"] is None


def test_odd_chunks_add_no_tokens():
    for odd in ({"choices": "x"}, {"choices": []}, {"choices": [{"delta": "x"}]}, {"choices": [{"delta": {"content": 5}}]},
                None, 7, [1]):
        assert load_test.delta_text(odd) == ""


def test_percentile_is_linear_between_ranks():
    values = [1, 2, 3, 4]
    assert load_test.percentile(values, 50) == 2.5
    assert load_test.percentile(values, 95) == pytest.approx(3.85)
    assert load_test.percentile([5], 99) == 5.0
    assert load_test.percentile([None, float("nan"), True, "x"], 50) is None


def test_level_summary_and_table():
    ok = {"ttft_ms": 100.0, "itl_ms": [10.0, 20.0], "tokens": 3, "error": None}
    slow = {"ttft_ms": 300.0, "itl_ms": [30.0], "tokens": 2, "error": None}
    failed = {"error": "HTTP 503"}
    level = load_test.level_summary(2, [ok, slow, failed], 2.0)
    assert level["requests"] == 3 and level["errors"] == 1 and level["tokens"] == 5
    assert level["aggregate_tps"] == 2.5 and level["ttft_p50_ms"] == 200.0 and level["itl_p50_ms"] == 20.0
    assert level["error_samples"] == ["HTTP 503"]
    table = load_test.load_table([level, load_test.level_summary(4, [failed], 1.0)])
    assert "| 2 | 3 | 200.0 / 290.0 / 298.0 | 20.00 / 29.00 / 29.80 | 2.50 | 1 |" in table
    assert "| 4 | 1 | — / — / — | — / — / — | — | 1 |" in table


def test_request_figures_take_the_clients_error_first():
    ok = load_test.request_figures({"sent": 1.0, "arrivals": [[1.5, chunk("a")]], "error": None})
    assert ok["ttft_ms"] == 500.0 and ok["error"] is None
    cut = load_test.request_figures({"sent": 1.0, "arrivals": [[1.5, chunk("a")]], "error": "stream ended"})
    assert cut["error"] == "stream ended" and cut["tokens"] == 1
    assert load_test.request_figures({"sent": None, "error": "ConnectionRefusedError: x"})["error"].startswith("Conn")
    assert load_test.request_figures({"sent": 1.0, "arrivals": "x"})["error"] == "no content in 0 events"


def test_the_load_clients_digests_count_as_the_chunks_they_stand_for():
    arrivals = [[1.5, chunk("a")], [1.6, {"content_length": 7}], [1.7, {"content_length": 0}],
                [1.8, {"content_length": 3, "timings": {"predicted_n": 2, "predicted_per_second": 40.0}}]]
    figures = load_test.request_figures({"sent": 1.0, "arrivals": arrivals, "error": None})
    assert figures["tokens"] == 3 and figures["itl_ms"] == pytest.approx([100.0, 200.0])
    assert figures["server"]["eval_tps"] == 40.0 and figures["error"] is None
    for odd in ({"content_length": True}, {"content_length": -4}, {"content_length": float("nan")},
                {"content_length": "7"}):
        assert load_test.content_length(odd) == 0


def test_times_that_are_no_numbers_make_no_figures():
    nan, inf = float("nan"), float("inf")
    assert load_test.request_figures({"sent": nan, "arrivals": [[1.5, chunk("a")]]})["ttft_ms"] is None
    figures = load_test.request_figures({"sent": 1.0, "arrivals": [[inf, chunk("a")], [1.5, chunk("b")]]})
    assert figures["tokens"] == 1 and figures["ttft_ms"] == 500.0
    ok = {"ttft_ms": 100.0, "itl_ms": [10.0], "tokens": 2, "error": None}
    for wall_s in (nan, inf, True, "2"):
        level = load_test.level_summary(1, [ok], wall_s)
        assert level["wall_s"] is None and level["aggregate_tps"] is None
    assert json.dumps(load_test.level_summary(1, [ok], nan), allow_nan=False)
