"""Claude Code (the real program, `@anthropic-ai/claude-code` from the npm registry: `make test` installs it into
.cache/claude-code) in print mode with ANTHROPIC_BASE_URL pointed at Choir: the exchange completes and it exits 0.

What Claude Code sends is what any user's install sends: `POST /v1/messages?beta=true`, streamed, its key as
`x-api-key` (ANTHROPIC_API_KEY) or a Bearer token (ANTHROPIC_AUTH_TOKEN), a dozen betas, a ~10k-token system
prompt with Claude Code's billing-header block, a dozen client tools, `thinking: {type: adaptive, display:
omitted}`, `output_config.effort`, `context_management` and `metadata.user_id`.

Two things are set for the tiny random model, neither in Choir: a context long enough for that prompt (its
weights are random, so RoPE past 2048 positions costs nothing: VLLM_ALLOW_LONG_MAX_MODEL_LEN), and an answer that
ends. The random weights almost never sample `</s>` (8000 tokens without one, measured), and Claude Code treats an
answer cut at max_tokens as an error. After Claude Code's prompt they write `<pad>` and nothing else (1500 tokens
of it, three times out of three, measured), so the test's generation config makes `<pad>` a second end-of-sequence
token, as a model's own generation_config.json may list several: each answer is an empty text block that ends its
turn. The protocol is what is checked.
"""

import json
import os
import re
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.integration.server import ROOT, start_server

pytestmark = pytest.mark.engine
CLAUDE = ROOT / ".cache" / "claude-code" / "node_modules" / ".bin" / "claude"
KEY = "claude-code-test-key"
MODEL = "choir-tiny"


@pytest.fixture(scope="module")
def claude() -> Path:
    if not CLAUDE.exists():
        if os.environ.get("CHOIR_TEST_CLAUDE_CODE") == "1":  # make test installs it: missing is a failure there
            pytest.fail(f"Claude Code is not installed at {CLAUDE}: run `make claude-code`")
        pytest.skip(f"Claude Code is not installed at {CLAUDE} (`make claude-code` installs it)")
    return CLAUDE


@pytest.fixture(scope="module")
def claude_server(tmp_path_factory, claude):
    where = tmp_path_factory.mktemp("claude-code")
    (where / "generation").mkdir()
    (where / "generation" / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    server = start_server(where / "server.log", env={
        "CHOIR_API_KEY": KEY, "CHOIR_TOOL_PARSER": "hermes", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
        "CHOIR_ENGINE_ARGS": f"--max-model-len 32768 --generation-config {where / 'generation'}"})
    yield server
    server.stop()


def run_claude(claude, server, tmp_path, *args, **env):
    """Claude Code in print mode, offline but for Choir: every model it names is Choir's, nothing else is called."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    environment = {"PATH": os.environ["PATH"], "HOME": str(home), "ANTHROPIC_BASE_URL": server.base_url,
                   "ANTHROPIC_MODEL": MODEL, "ANTHROPIC_DEFAULT_OPUS_MODEL": MODEL,
                   "ANTHROPIC_DEFAULT_SONNET_MODEL": MODEL, "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL,
                   "ANTHROPIC_SMALL_FAST_MODEL": MODEL, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                   "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
                   "NO_PROXY": "127.0.0.1,localhost", **env}  # a proxy setting would apply to Choir's loopback URL too
    # stdin closed: with an open pipe it waits seconds for a prompt there
    return subprocess.run([str(claude), "-p", "Say hi.", *args], cwd=tmp_path, env=environment, capture_output=True,
                          stdin=subprocess.DEVNULL, text=True, timeout=300)


def answered(server) -> dict[str, float]:
    """POST /v1/messages answers so far, by status (Choir's request counter)."""
    metrics = httpx.get(f"{server.base_url}/metrics").text
    pattern = r'choir_requests_total\{method="POST",route="createMessage",status="(\d+)"\} (\S+)'
    return {status: float(count) for status, count in re.findall(pattern, metrics)}


def test_print_mode_with_an_api_key_completes(claude, claude_server, tmp_path):
    before = answered(claude_server)
    done = run_claude(claude, claude_server, tmp_path, "--output-format", "json", ANTHROPIC_API_KEY=KEY)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    result = json.loads(done.stdout)
    assert result["type"] == "result" and result["subtype"] == "success" and result["is_error"] is False, result
    assert result["stop_reason"] == "end_turn" and result["terminal_reason"] == "completed"
    assert result["usage"]["input_tokens"] > 1000  # its system prompt and tools reached the model
    after = answered(claude_server)
    new = {status: count - before.get(status, 0) for status, count in after.items() if count > before.get(status, 0)}
    assert new.keys() == {"200"}, new  # every turn (streamed) answered 200


def test_stream_json_with_a_bearer_token_completes(claude, claude_server, tmp_path):
    done = run_claude(claude, claude_server, tmp_path, "--output-format", "stream-json", "--verbose",
                      ANTHROPIC_AUTH_TOKEN=KEY)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    events = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    init, result = events[0], events[-1]
    assert (init["type"], init["subtype"], init["model"]) == ("system", "init", MODEL)
    # An empty answer (see above) gets one synthetic "please continue" turn: a second request, with the history
    assert result["type"] == "result" and result["is_error"] is False and result["stop_reason"] == "end_turn"
    assert result["num_turns"] >= 1 and result["ttft_ms"] > 0


def test_a_wrong_key_is_reported_as_an_authentication_error(claude, claude_server, tmp_path):
    done = run_claude(claude, claude_server, tmp_path, "--output-format", "json", ANTHROPIC_API_KEY="wrong",
                      CLAUDE_CODE_MAX_RETRIES="0")  # it retries a 401 for minutes otherwise
    assert done.returncode != 0
    result = json.loads(done.stdout)
    assert result["is_error"] is True and "401" in json.dumps(result), result
