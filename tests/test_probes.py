"""The probes a cluster reads (open, as on vLLM's server): /ping is liveness as /health is, /ready is readiness
(not while an engine is dead or the server drains), /load is the engine requests not yet finished."""

import pytest

from tests.test_errors import error_of


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_ping_is_liveness_as_health_is(client, fake_engine, method):
    answer = client.request(method, "/ping")
    assert answer.status_code == 200 and answer.json() == client.get("/health").json()
    fake_engine.is_alive = False
    assert "engine is dead" in error_of(client.request(method, "/ping"), 503)


def test_ready_until_an_engine_dies(client, fake_engine):
    answer = client.get("/ready")
    assert answer.status_code == 200 and answer.json() == {"status": "ready"}
    fake_engine.is_alive = False
    error_of(client.get("/ready"), 503)


def test_draining_is_not_ready_but_still_alive(client):
    drain = client.app.state["drain"]

    async def signal_came() -> None:
        drain._start()  # what SIGTERM's handler schedules on the loop

    client.blocking_portal.call(signal_came)
    assert "draining" in error_of(client.get("/ready"), 503)
    assert client.get("/health").status_code == 200 and client.get("/ping").status_code == 200


def test_load_counts_the_requests_not_finished(client, fake_engine):
    assert client.get("/load").json() == {"server_load": 0}
    fake_engine.running.update({"0_cmpl-a", "1_cmpl-a", "cmpl-b"})
    assert client.get("/load").json() == {"server_load": 3}


def test_probes_refuse_other_methods(client):
    assert client.post("/ready").status_code == 405 and client.post("/load").status_code == 405
