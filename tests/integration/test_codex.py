"""The Codex CLI (the real program, `@openai/codex` from the npm registry: `make test` installs it into .cache/codex)
in `codex exec` mode, configured with a custom provider on Choir's Responses API (`wire_api = "responses"`).

What Codex sends is what any user's install sends: its system prompt as `developer` messages, function tools, a
`namespace` tool, a hosted `web_search`, `reasoning.encrypted_content` asked for, `store: false` (every later turn
sends the whole conversation back), `prompt_cache_key`, `client_metadata`, streamed.

On the real engine (the bundled tiny model, set up as the Claude Code test sets it up: a long context, `<pad>` a
second end token, so that each answer ends) one turn completes. On a scripted engine (tests/integration/
scripted_agent.py) the model calls `exec_command`: Codex runs it in its read-only sandbox, sends the output back,
and the turn completes; a resumed session's next turn, with all of that sent back again, completes too.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.integration.scripted_agent import MARK
from tests.integration.server import ROOT, Server, free_port, healthy, start_server

pytestmark = pytest.mark.engine
CODEX = ROOT / ".cache" / "codex" / "node_modules" / ".bin" / "codex"
KEY = "codex-test-key"
MODEL = "choir-tiny"


@pytest.fixture(scope="module")
def codex() -> Path:
    if not CODEX.exists():
        if os.environ.get("CHOIR_TEST_CODEX") == "1":  # make test installs it: missing is a failure there
            pytest.fail(f"the Codex CLI is not installed at {CODEX}: run `make codex`")
        pytest.skip(f"the Codex CLI is not installed at {CODEX} (`make codex` installs it)")
    return CODEX


@pytest.fixture(scope="module")
def real_server(tmp_path_factory, codex):
    where = tmp_path_factory.mktemp("codex-real")
    (where / "generation").mkdir()
    (where / "generation" / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    server = start_server(where / "server.log", env={
        "CHOIR_API_KEY": KEY, "CHOIR_TOOL_PARSER": "hermes", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
        "CHOIR_ENGINE_ARGS": f"--max-model-len 32768 --generation-config {where / 'generation'}"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def scripted_server(tmp_path_factory, codex):
    where = tmp_path_factory.mktemp("codex-scripted")
    port = free_port()
    env = {**os.environ, "CHOIR_API_KEY": KEY, "CHOIR_STORE_URL": f"sqlite+aiosqlite:///{where / 'store.sqlite3'}"}
    log = where / "server.log"
    app = "tests.integration.scripted_agent:create_app"
    process = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory", app, "--host", "127.0.0.1", "--port",
                                str(port)], cwd=ROOT, env=env,
                               stdout=log.open("w"), stderr=subprocess.STDOUT)
    server = healthy(Server(process, f"http://127.0.0.1:{port}", log))
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


def answered(server: Server) -> dict[str, float]:
    """POST /v1/responses answers so far, by status (Choir's request counter)."""
    metrics = httpx.get(f"{server.base_url}/metrics").text
    pattern = r'choir_requests_total\{method="POST",route="createResponse",status="(\d+)"\} (\S+)'
    return {status: float(count) for status, count in re.findall(pattern, metrics)}


def new_answers(server: Server, before: dict[str, float]) -> dict[str, float]:
    after = answered(server)
    return {status: count - before.get(status, 0) for status, count in after.items() if count > before.get(status, 0)}


def test_a_turn_on_the_real_engine_completes(codex, real_server, tmp_path):
    before = answered(real_server)
    done = run_codex(codex, real_server, tmp_path / "home", "Say hi.")
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    seen = events(done)
    assert seen[-1]["type"] == "turn.completed" and seen[-1]["usage"]["input_tokens"] > 1000, seen[-1]
    assert new_answers(real_server, before).keys() == {"200"}


def test_a_wrong_key_is_reported_as_401(codex, real_server, tmp_path):
    done = run_codex(codex, real_server, tmp_path / "home", "Say hi.", key="wrong")
    assert done.returncode != 0
    assert "401" in done.stdout + done.stderr


def test_a_tool_round_trip_and_a_resumed_turn_complete(codex, scripted_server, tmp_path):
    """Turn 1: the model calls exec_command; Codex runs `echo` in its read-only sandbox and sends the output back
    (request 2: the call and its output, the reasoning-free history); the model answers. Then the session is
    resumed for another turn (request 3: everything again, and the new message)."""
    home = tmp_path / "home"
    before = answered(scripted_server)
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
    assert new_answers(scripted_server, before) == {"200": 3.0}
