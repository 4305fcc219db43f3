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


def test_not_ready_until_the_store_is_migrated(tmp_path):
    """A store that cannot be reached at start-up: the server is alive and serves what needs no store, but not
    ready (a cluster sends it nothing yet); ready once the store is, without a restart."""
    from litestar.testing import TestClient

    from choir.app.asgi import create_app
    from choir.core.settings import Settings
    from tests.fakes import FakeEngine, fake_engine_factory

    blocked = tmp_path / "store"
    blocked.write_text("a file where the store's directory should be")
    settings = Settings(served_model_name="fake-model", store_url=f"sqlite+aiosqlite:///{blocked}/s.db")
    with TestClient(create_app(settings, engine_factory=fake_engine_factory(FakeEngine()))) as client:
        assert client.get("/health").status_code == 200
        assert "store" in error_of(client.get("/ready"), 503)
        blocked.unlink()
        answer = client.get("/ready")
        assert answer.status_code == 200 and answer.json() == {"status": "ready"}
        assert client.post("/v1/responses", json={"input": "hi"}).status_code == 200
