"""`choir serve` on the real engine, started with a vLLM user's command line: engine options reach the engine, and
the front-end options Choir maps do what they do on `vllm serve` (--served-model-name, --api-key, --chat-template,
--default-chat-template-kwargs, --response-role, --enable-log-requests with --max-log-len, --allowed-origins)."""

import json
import os
import subprocess
import sys

import httpx
import openai
import pytest

from choir.core.settings import BUNDLED_MODEL_DIR
from tests.integration.server import ROOT, Server, free_port, healthy

pytestmark = pytest.mark.engine

TEMPLATE = ("{{ bos_token }}{% if preamble is defined %}{{ preamble }}{% endif %}{% for m in messages %}"
            "{{ '<|' + m['role'] + '|>\\n' + m['content'] + eos_token + '\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    where = tmp_path_factory.mktemp("serve-command")
    (where / "template.jinja").write_text(TEMPLATE)
    port = free_port()
    command = [sys.executable, "-m", "choir", "serve", str(BUNDLED_MODEL_DIR), "--host", "127.0.0.1", "--port",
               str(port), "--served-model-name", "tiny-cli", "--api-key", "cli-key", "--max-model-len", "1024",
               "--chat-template", str(where / "template.jinja"), "--default-chat-template-kwargs",
               json.dumps({"preamble": "The quick brown fox"}), "--response-role", "narrator",
               "--enable-log-requests", "--max-log-len", "6", "--allowed-origins", '["https://app.example"]',
               "--store-url", f"sqlite+aiosqlite:///{where / 'store.sqlite3'}"]
    log = where / "server.log"
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "VLLM_HOST_IP": "127.0.0.1"},
                               stdout=log.open("w"), stderr=subprocess.STDOUT)
    server = healthy(Server(process, f"http://127.0.0.1:{port}", log))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="cli-key", max_retries=0, timeout=120)


def test_engine_options_and_names_reach_the_engine(client):
    (card,) = client.models.list().data
    assert card.id == "tiny-cli" and card.model_extra["max_model_len"] == 1024


def test_the_api_key_is_required(served):
    assert httpx.get(f"{served.base_url}/v1/models").status_code == 401


def test_the_chat_template_and_its_default_kwargs_render_the_prompt(served):
    headers = {"Authorization": "Bearer cli-key"}
    tokens = httpx.post(f"{served.base_url}/tokenize", headers=headers, json={
        "model": "tiny-cli", "messages": [{"role": "user", "content": "hi"}]}).json()["tokens"]
    text = httpx.post(f"{served.base_url}/detokenize", headers=headers,
                      json={"model": "tiny-cli", "tokens": tokens}).json()["prompt"]
    assert "The quick brown fox<|user|>\nhi" in text
    # A request's own kwargs win over the server's defaults.
    tokens = httpx.post(f"{served.base_url}/tokenize", headers=headers, json={
        "model": "tiny-cli", "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"preamble": "Hello!"}}).json()["tokens"]
    text = httpx.post(f"{served.base_url}/detokenize", headers=headers,
                      json={"model": "tiny-cli", "tokens": tokens}).json()["prompt"]
    assert "Hello!<|user|>" in text and "quick brown" not in text


def test_the_answer_has_the_response_role(client):
    chat = client.chat.completions.create(model="tiny-cli", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=3)
    assert chat.choices[0].message.role == "narrator"
    stream = client.chat.completions.create(model="tiny-cli", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=3, stream=True)
    assert next(chunk for chunk in stream if chunk.choices).choices[0].delta.role == "narrator"


def test_requests_are_logged_by_vllms_request_logger(client, served):
    client.completions.create(model="tiny-cli", prompt="a prompt of many words to log", max_tokens=2)
    lines = [line for line in served.log().splitlines() if "Received request" in line]
    assert lines and "SamplingParams" in lines[-1]


def test_cors_answers_the_allowed_origin(served):
    response = httpx.options(f"{served.base_url}/v1/chat/completions", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
    assert response.headers["access-control-allow-origin"] == "https://app.example"
