"""One structured log line per request: ids, status, latency and token counts, never text or chunks."""

from structlog.testing import capture_logs


def request_lines(logs):
    return [entry for entry in logs if entry["event"] == "request"]


def test_one_line_per_request_with_tokens_and_no_text(client):
    with capture_logs() as logs:
        client.post("/v1/completions", json={"prompt": "secret prompt"}, headers={"X-Request-Id": "L1"})
    [line] = request_lines(logs)
    assert line["method"] == "POST" and line["path"] == "/v1/completions" and line["status"] == 200
    assert line["request_id"] == "cmpl-L1" and line["latency_ms"] >= 0
    assert line["prompt_tokens"] == 14 and line["completion_tokens"] == 12
    assert "secret" not in repr(logs) and "Hello" not in repr(logs)


def test_a_stream_is_one_line_not_one_per_chunk(client):
    with capture_logs() as logs:
        client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "stream": True,
                                                 "n": 2})
    [line] = request_lines(logs)
    assert line["status"] == 200 and line["completion_tokens"] == 24


def test_errors_are_logged_with_their_status(client):
    with capture_logs() as logs:
        client.post("/v1/completions", json={"prompt": "x", "temperature": 9})
    [line] = request_lines(logs)
    assert line["status"] == 400


def test_metrics_count_requests_fanout_and_streams(client, fake_engine):
    from prometheus_client.parser import text_string_to_metric_families

    def samples():
        text = client.get("/metrics").text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    before = samples()
    client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "n": 3,
                                              "stream": True})
    client.post("/v1/completions", json={"prompt": "x", "temperature": 9})
    after = samples()

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    assert delta("choir_requests_total", route="createChatCompletion", method="POST", status="200") == 1
    assert delta("choir_requests_total", route="createCompletion", method="POST", status="400") == 1
    assert delta("choir_fanout_children_total") == 3
    assert delta("choir_time_to_first_chunk_seconds_count", route="createChatCompletion") == 1
    assert delta("choir_request_duration_seconds_count", route="createCompletion") == 1
    assert client.get("/metrics").headers["content-type"].startswith("text/plain")


def test_each_log_line_is_one_write_with_its_newline():
    """Several processes share one log (API processes, vLLM's engine): a line written in two parts could have
    another process's line land between its text and its newline (seen in CI: a JSON line run on into vLLM's)."""
    import json

    import structlog

    from choir.app.request_log import configure_logging

    class Recording:
        def __init__(self):
            self.writes: list[str] = []

        def write(self, text: str) -> int:
            self.writes.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    file = Recording()
    configure_logging("info", file)
    try:
        structlog.get_logger("choir.test").info("serving", url="http://127.0.0.1:1", pids=[1, 2])
        structlog.get_logger("choir.test").debug("not at info")
    finally:
        configure_logging("info")
    [line] = file.writes
    assert line.endswith("\n") and line.count("\n") == 1
    assert json.loads(line)["event"] == "serving"
