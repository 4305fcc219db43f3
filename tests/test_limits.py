"""Limits: each over-limit request gets a clear error naming the limit, and nothing else breaks."""

from litestar.testing import TestClient

from choir.app.asgi import create_app
from choir.core.settings import Settings
from tests.fakes import FakeEngine, fake_engine_factory


def make_client(**limits):
    app = create_app(Settings(served_model_name="fake-model", **limits),
                     engine_factory=fake_engine_factory(FakeEngine(max_model_len=4096)))
    return TestClient(app)


def test_body_size_limit():
    with make_client(max_body_bytes=1000) as client:
        response = client.post("/v1/completions", json={"prompt": "x" * 2000})
        assert response.status_code == 413 and "CHOIR_MAX_BODY_BYTES" in response.json()["error"]["message"]
        assert client.post("/v1/completions", json={"prompt": "x"}).status_code == 200


def test_number_of_prompts_limit():
    with make_client(max_prompts=3) as client:
        response = client.post("/v1/completions", json={"prompt": ["a"] * 4})
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == "prompt" and "CHOIR_MAX_PROMPTS" in error["message"]
        assert client.post("/v1/completions", json={"prompt": ["a"] * 3}).status_code == 200


def test_n_times_prompts_limit():
    with make_client(max_choices=6) as client:
        response = client.post("/v1/completions", json={"prompt": ["a", "b", "c"], "n": 3})
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == "n" and "CHOIR_MAX_CHOICES" in error["message"]
        assert client.post("/v1/completions", json={"prompt": ["a", "b"], "n": 3}).status_code == 200


def test_n_limit_names_the_setting():
    with make_client(max_n=2) as client:
        error = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                          "n": 3}).json()["error"]
        assert error["param"] == "n" and "CHOIR_MAX_N" in error["message"]


def test_max_tokens_limit_is_the_context():
    with make_client() as client:
        error = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 5000}).json()["error"]
        assert error["param"] == "max_tokens" and "4096" in error["message"]
