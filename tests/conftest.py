import os

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
