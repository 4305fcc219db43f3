"""vLLM's batched chat (/v1/chat/completions/batch) and SageMaker's /invocations over scripted fake engines."""

import pytest
from litestar.testing import TestClient

from choir.app.asgi import create_app
from choir.core.settings import RoleModel, Settings
from choir.engine.protocol import NO_OPTIONS
from tests.fakes import FakeEngine, FakePoolingEngine, fake_engine_factory
from tests.sse import sse_json

BATCH = "/v1/chat/completions/batch"
CONVERSATIONS = [[{"role": "user", "content": "first"}],
                 [{"role": "system", "content": "be brief"}, {"role": "user", "content": "second"}]]


def test_one_choice_per_conversation(client, fake_engine):
    fake_engine.script = lambda prompt, params: ["one"] if "first" in prompt else ["two", " words"]
    body = client.post(BATCH, json={"messages": CONVERSATIONS, "max_tokens": 5},
                       headers={"X-Request-Id": "b1"}).json()
    assert body["id"] == "chatcmpl-b1" and body["object"] == "chat.completion"
    assert [(c["index"], c["message"]["content"]) for c in body["choices"]] == [(0, "one"), (1, "two words")]
    assert sorted(call.request_id for call in fake_engine.calls) == ["chatcmpl-b1_0", "chatcmpl-b1_1"]
    prompts = {call.request_id: len(call.prompt.token_ids) for call in fake_engine.calls}
    usage = body["usage"]
    assert usage["prompt_tokens"] == sum(prompts.values())
    assert usage["completion_tokens"] == 3 + 9 and usage["total_tokens"] == usage["prompt_tokens"] + 12


@pytest.mark.parametrize("extra, param", [({"n": 2}, "n"), ({"stream": True}, "stream"), ({"best_of": 2}, "best_of"),
                                          ({"messages": []}, "messages"), ({"messages": [[]]}, "messages[0]"),
                                          ({"messages": [CONVERSATIONS[0], [{"role": "wizard", "content": "x"}]]},
                                           "messages[1][0].role")])
def test_refusals_name_the_field(client, fake_engine, extra, param):
    response = client.post(BATCH, json={"messages": CONVERSATIONS, **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert fake_engine.calls == []


def test_one_failing_conversation_fails_the_batch_and_stops_the_others(client, fake_engine):
    from choir.core.errors import EngineRejected

    original = fake_engine.generate
    fake_engine.delay = 0.05
    fake_engine.script = lambda prompt, params: ["x"] * 50

    async def generate(prompt, params, request_id, options=NO_OPTIONS):
        if request_id.endswith("_1"):
            raise EngineRejected("this conversation is refused", "messages")
        async for output in original(prompt, params, request_id, options):
            yield output

    fake_engine.generate = generate
    response = client.post(BATCH, json={"messages": CONVERSATIONS, "max_tokens": 50})
    assert response.status_code == 400 and "refused" in response.json()["error"]["message"]
    assert [call.request_id for call in fake_engine.calls if call.request_id.endswith("_0")]
    assert fake_engine.aborted and fake_engine.running == set()


@pytest.fixture
def with_embeddings():
    app = create_app(Settings(served_model_name="fake-model", pooling=(RoleModel("embed", "/models/fake-embed"),)),
                     engine_factory=fake_engine_factory(FakeEngine()),
                     factories={"embed": fake_engine_factory(FakePoolingEngine())})
    with TestClient(app) as client:
        yield client


@pytest.mark.parametrize("body, kind", [({"messages": [{"role": "user", "content": "hi"}]}, "chat.completion"),
                                        ({"prompt": "hi"}, "text_completion"), ({"input": "hi"}, "list")])
def test_invocations_route_by_the_bodys_shape(with_embeddings, body, kind):
    answer = with_embeddings.post("/invocations", json=body)
    assert answer.status_code == 200 and answer.json()["object"] == kind


def test_invocations_stream_as_the_endpoint_does(client):
    chunks, done = sse_json(client.post("/invocations", json={"prompt": "hi", "stream": True}).text)
    assert done == 1 and "".join(c["choices"][0]["text"] for c in chunks) == "Hello world!"


@pytest.mark.parametrize("body", [{"query": "x"}, {}, [1, 2], "text"])
def test_invocations_of_no_known_shape_are_a_400(client, fake_engine, body):
    response = client.post("/invocations", json=body)
    assert response.status_code == 400 and "messages" in response.json()["error"]["message"]
    assert fake_engine.calls == []


def test_invocations_apply_the_endpoints_rules(client):
    response = client.post("/invocations", json={"messages": [{"role": "user", "content": "x"}], "functions": []})
    assert response.status_code == 400 and response.json()["error"]["param"] == "functions"
    assert client.post("/invocations", json={"input": "x"}).status_code == 404  # no embedding engine here
