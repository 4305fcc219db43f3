"""Claude Code (the real program, `@anthropic-ai/claude-code` from the npm registry: `make test` installs it into
.cache/claude-code) in print mode with ANTHROPIC_BASE_URL pointed at Choir: the exchange completes and it exits 0.

What Claude Code sends is what any user's install sends: `POST /v1/messages?beta=true`, streamed, its key as
`x-api-key` (ANTHROPIC_API_KEY) or a Bearer token (ANTHROPIC_AUTH_TOKEN), a dozen betas, a ~10k-token system
prompt with Claude Code's billing-header block, a dozen client tools, `thinking: {type: adaptive, display:
omitted}`, `output_config.effort`, `context_management` and `metadata.user_id`.

The server is the real engine set up for an agent's long prompt (tests/integration/agent_servers.py): each answer
is an empty text block that ends its turn. The protocol is what is checked.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.agent_servers import MODEL, answered, installed, start_agent_server

pytestmark = pytest.mark.engine
KEY = "claude-code-test-key"


@pytest.fixture(scope="module")
def claude() -> Path:
    return installed("claude-code", "claude")


@pytest.fixture(scope="module")
def claude_server(tmp_path_factory, claude):
    server = start_agent_server(tmp_path_factory.mktemp("claude-code"), KEY)
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


def test_print_mode_with_an_api_key_completes(claude, claude_server, tmp_path):
    before = answered(claude_server, "createMessage")
    done = run_claude(claude, claude_server, tmp_path, "--output-format", "json", ANTHROPIC_API_KEY=KEY)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    result = json.loads(done.stdout)
    assert result["type"] == "result" and result["subtype"] == "success" and result["is_error"] is False, result
    assert result["stop_reason"] == "end_turn" and result["terminal_reason"] == "completed"
    assert result["usage"]["input_tokens"] > 1000  # its system prompt and tools reached the model
    after = answered(claude_server, "createMessage")
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
