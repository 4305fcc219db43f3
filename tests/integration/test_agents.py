"""The other agent programs users point at vLLM, each the real program (a pinned release from the npm registry that
`make test` installs into .cache/) in its non-interactive mode on Choir's chat completions API: opencode
(`opencode-ai`, `opencode run`, an OpenAI-compatible provider in its config) and Qwen Code
(`@qwen-code/qwen-code`, `qwen` with OPENAI_BASE_URL). For each: its requests on the real engine (set up for
an agent's prompt: tests/integration/agent_servers.py) are answered, and on a scripted engine the model calls the
program's shell tool, the program runs it and sends the output back, and the turn completes."""

import json
import os
import subprocess
from collections.abc import Callable
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
KEY = "agents-test-key"
ROUTE = "createChatCompletion"
Run = Callable[[Path, Server, Path, str], subprocess.CompletedProcess]


def run_opencode(program: Path, server: Server, where: Path, prompt: str,
                 key: str = KEY) -> subprocess.CompletedProcess:
    """`opencode run --format json PROMPT` with Choir as an OpenAI-compatible provider, every tool allowed."""
    config = {"$schema": "https://opencode.ai/config.json", "model": f"choir/{MODEL}", "autoupdate": False,
              "share": "disabled", "permission": {"bash": "allow", "edit": "allow"},
              "provider": {"choir": {"npm": "@ai-sdk/openai-compatible", "name": "Choir",
                                     "options": {"baseURL": f"{server.base_url}/v1", "apiKey": key},
                                     "models": {MODEL: {"name": MODEL}}}}}
    (where / "opencode.json").write_text(json.dumps(config))
    env = {"OPENCODE_CONFIG": str(where / "opencode.json")}
    return _run([str(program), "run", "--format", "json", "-m", f"choir/{MODEL}", prompt], where, env)


def run_qwen(program: Path, server: Server, where: Path, prompt: str, key: str = KEY) -> subprocess.CompletedProcess:
    """`qwen --yolo --output-format json PROMPT` with Choir as its OpenAI-compatible endpoint."""
    env = {"OPENAI_API_KEY": key, "OPENAI_BASE_URL": f"{server.base_url}/v1", "OPENAI_MODEL": MODEL,
           "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"}
    return _run([str(program), "--yolo", "--output-format", "json", "-m", MODEL, prompt], where, env)


EMPTY_ANSWER = "Model stream ended with empty response text"  # Qwen Code's refusal of an answer with no text


def _run(command: list[str], where: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    (where / "home").mkdir(exist_ok=True)
    (where / "work").mkdir(exist_ok=True)
    environment = {"PATH": os.environ["PATH"], "HOME": str(where / "home"), "NO_PROXY": "127.0.0.1,localhost", **env}
    return subprocess.run(command, cwd=where / "work", env=environment, capture_output=True, stdin=subprocess.DEVNULL,
                          text=True, timeout=300)


def opencode_outcome(done: subprocess.CompletedProcess) -> tuple[list[str], list[str]]:
    """What ran (each tool's output) and what was said, from opencode's JSON events."""
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    ran = [e["part"]["state"]["output"] for e in events if e["type"] == "tool_use"]
    said = [e["part"]["text"] for e in events if e["type"] == "text"]
    return ran, said


def qwen_outcome(done: subprocess.CompletedProcess) -> tuple[list[str], list[str]]:
    messages = json.loads(done.stdout)
    ran = [str(block.get("content")) for m in messages if m["type"] == "user"
           for block in m["message"]["content"] if isinstance(block, dict) and block.get("type") == "tool_result"]
    (result,) = [m for m in messages if m["type"] == "result"]
    assert result["is_error"] is False, result
    return ran, [result["result"]]


# name: ((its .cache folder, its command), its shell tool, how it runs, what it did)
PROGRAMS = {"opencode": (("opencode", "opencode"), "bash", run_opencode, opencode_outcome),
            "qwen-code": (("qwen-code", "qwen"), "run_shell_command", run_qwen, qwen_outcome)}


@pytest.fixture(scope="module")
def real_server(tmp_path_factory):
    if not any((Path(".cache") / name).exists() for name in PROGRAMS) and os.environ.get("CHOIR_TEST_AGENTS") != "1":
        pytest.skip("neither opencode nor Qwen Code is installed (`make opencode qwen-code`)")
    server = start_agent_server(tmp_path_factory.mktemp("agents-real"), KEY)
    yield server
    server.stop()


def test_opencode_completes_a_turn_on_the_real_engine(real_server, tmp_path):
    program = installed("opencode", "opencode")
    before = answered(real_server, ROUTE)
    done = run_opencode(program, real_server, tmp_path, "Say hi.")
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert answered_since(real_server, ROUTE, before).keys() == {"200"}


def test_qwen_code_is_answered_on_the_real_engine(real_server, tmp_path):
    """Every request Qwen Code sends is answered (200, streamed, its 39 tools and 10 000-token prompt rendered);
    the tiny model's answer after so long a prompt is empty (see agent_servers.py), which Qwen Code refuses
    after its retries ("Model stream ended with empty response text"), on vLLM's server alike. The text of an
    answer is the model's; a tool round trip with an answer that has text is the scripted test below."""
    program = installed("qwen-code", "qwen")
    before = answered(real_server, ROUTE)
    done = run_qwen(program, real_server, tmp_path, "Say hi.")
    answers = answered_since(real_server, ROUTE, before)
    assert answers.keys() == {"200"} and answers["200"] >= 1
    assert done.returncode == 0 or EMPTY_ANSWER in done.stdout, (done.stdout[-3000:], done.stderr[-3000:])


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_tool_round_trip_completes(name, tmp_path):
    """The model calls the program's shell tool to `echo` a mark; the program runs it, sends the output back,
    and the model's answer ends the turn."""
    (package, binary), tool, run, outcome = PROGRAMS[name]
    program = installed(package, binary)
    server = start_scripted_server(tmp_path, KEY, tool)
    try:
        done = run(program, server, tmp_path, "Run the check.")
        assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
        ran, said = outcome(done)
        assert ran and MARK in ran[0], done.stdout[-3000:]
        assert said[-1] == "The command printed it. Done."
        assert answered(server, ROUTE).keys() == {"200"}
    finally:
        server.stop()
