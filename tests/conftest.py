import logging
import os
import sys

import pytest
from litestar.testing import TestClient

from choir.app.asgi import create_app
from choir.core.settings import Settings
from tests.databases import postgres, store_url  # noqa: F401 - the store's databases, for every test
from tests.fakes import FakeEngine, fake_engine_factory

os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")


@pytest.fixture
def fake_engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(fake_engine: FakeEngine):
    """The real app, in-process, over a fake engine (entering the client runs the lifespan)."""
    app = create_app(Settings(served_model_name="fake-model"), engine_factory=fake_engine_factory(fake_engine))
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture
def environ():
    """os.environ, as it was again after the test: for Choir's start-up run in the test's process, which sets
    variables for the processes it would start. Request it before capfd: vLLM's logging, set up again while the
    engine's config is made, keeps the stream of that moment (capfd's, closed after the test), so it is pointed
    back at the session's."""
    import vllm.logger  # noqa: F401 - its handler made now, outside the test's capture

    saved = dict(os.environ)
    yield os.environ
    os.environ.clear()
    os.environ.update(saved)
    for handler in logging.getLogger("vllm").handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream.closed:
            handler.stream = sys.stdout  # not setStream: it flushes the closed one first
