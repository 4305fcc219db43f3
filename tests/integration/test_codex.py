"""The Codex CLI (the real program, `@openai/codex` from the npm registry: `make test` installs it into .cache/codex)
in `codex exec` mode, configured with a custom provider on Choir's Responses API (`wire_api = "responses"`).

What Codex sends is what any user's install sends: its system prompt as `developer` messages, function tools, a
`namespace` tool, a hosted `web_search`, `reasoning.encrypted_content` asked for, `store: false` (every later turn
sends the whole conversation back), `prompt_cache_key`, `client_metadata`, streamed.

On the real engine (the bundled tiny model set up for an agent: tests/integration/agent_servers.py) one turn
completes. On a scripted engine (tests/integration/
scripted_agent.py) the model calls `exec_command`: Codex runs it in its read-only sandbox, sends the output back,
and the turn completes; a resumed session's next turn, with all of that sent back again, completes too.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.agent_servers import (
    MODEL,
    answered,
    answered_since,
    installed,
    start_agent_server,
    start_scripted_server,
)
from tests.integration.scripted_agent import MARK
from tests.integration.server import Server

pytestmark = pytest.mark.engine
KEY = "codex-test-key"
ROUTE = "createResponse"


@pytest.fixture(scope="module")
def codex() -> Path:
    return installed("codex", "codex")


@pytest.fixture(scope="module")
def real_server(tmp_path_factory, codex):
    server = start_agent_server(tmp_path_factory.mktemp("codex-real"), KEY)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def scripted_server(tmp_path_factory, codex):
    server = start_scripted_server(tmp_path_factory.mktemp("codex-scripted"), KEY, "exec_command")
    yield server
    server.stop()


def run_codex(codex: Path, server: Server, home: Path, *args: str, key: str = KEY) -> subprocess.CompletedProcess:
    """`codex exec ARGS` with a config of its own (CODEX_HOME) naming Choir as its provider; stdin closed."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(f'''model = "{MODEL}"
model_provider = "choir"
approval_policy = "never"
sandbox_mode = "read-only"

[model_providers.choir]
name = "Choir"
base_url = "{server.base_url}/v1"
wire_api = "responses"
env_key = "CHOIR_TEST_KEY"
request_max_retries = 0
stream_max_retries = 0
''')
    work = home.parent / "work"
    work.mkdir(exist_ok=True)
    environment = {"PATH": os.environ["PATH"], "HOME": str(home.parent), "CODEX_HOME": str(home),
                   "CHOIR_TEST_KEY": key, "NO_PROXY": "127.0.0.1,localhost"}
    return subprocess.run([str(codex), "exec", "--skip-git-repo-check", "--json", *args], cwd=work, env=environment,
                          capture_output=True, stdin=subprocess.DEVNULL, text=True, timeout=300)


def events(done: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_a_turn_on_the_real_engine_completes(codex, real_server, tmp_path):
    before = answered(real_server, ROUTE)
    done = run_codex(codex, real_server, tmp_path / "home", "Say hi.")
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    seen = events(done)
    assert seen[-1]["type"] == "turn.completed" and seen[-1]["usage"]["input_tokens"] > 1000, seen[-1]
    assert answered_since(real_server, ROUTE, before).keys() == {"200"}


def test_a_wrong_key_is_reported_as_401(codex, real_server, tmp_path):
    done = run_codex(codex, real_server, tmp_path / "home", "Say hi.", key="wrong")
    assert done.returncode != 0
    assert "401" in done.stdout + done.stderr


def test_a_tool_round_trip_and_a_resumed_turn_complete(codex, scripted_server, tmp_path):
    """Turn 1: the model calls exec_command; Codex runs `echo` in its read-only sandbox and sends the output back
    (request 2: the call and its output, the reasoning-free history); the model answers. Then the session is
    resumed for another turn (request 3: everything again, and the new message)."""
    home = tmp_path / "home"
    before = answered(scripted_server, ROUTE)
    done = run_codex(codex, scripted_server, home, "Run the check.")
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    seen = events(done)
    ran = [e["item"] for e in seen if e["type"] == "item.completed" and e["item"]["type"] == "command_execution"]
    assert ran and MARK in ran[0]["aggregated_output"] and ran[0]["exit_code"] == 0, seen
    said = [e["item"]["text"] for e in seen if e["type"] == "item.completed" and e["item"]["type"] == "agent_message"]
    assert said == ["The command printed it. Done."] and seen[-1]["type"] == "turn.completed"
    thread = next(e["thread_id"] for e in seen if e["type"] == "thread.started")
    again = run_codex(codex, scripted_server, home, "resume", thread, "And once more?")
    assert again.returncode == 0, (again.stdout[-3000:], again.stderr[-3000:])
    assert events(again)[-1]["type"] == "turn.completed"
    assert answered_since(scripted_server, ROUTE, before) == {"200": 3.0}
