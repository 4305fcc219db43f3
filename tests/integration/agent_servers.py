"""What the agent programs' tests share (test_claude_code.py, test_codex.py, test_agents.py): the installed program,
a real server set up for an agent's long prompts, a scripted one whose model calls the agent's shell tool, and the
count of answers by status.

The real server serves the bundled tiny model with two things set for it, neither in Choir: a context long enough
for an agent's prompt (its weights are random, so RoPE past 2048 positions costs nothing:
VLLM_ALLOW_LONG_MAX_MODEL_LEN), and an answer that ends. The random weights almost never sample `</s>` (8000
tokens without one, measured), and agents treat an answer cut at its token limit as an error; after an agent's
prompt they write `<pad>` and nothing else (1500 tokens of it, three times out of three, measured), so the
generation config makes `<pad>` a second end-of-sequence token, as a model's own generation_config.json may list
several. Each answer is then an empty text that ends the turn: the protocol is what is checked.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.integration.server import ROOT, Server, free_port, healthy, start_server

MODEL = "choir-tiny"


def installed(name: str, binary: str) -> Path:
    """The program `make test` installs into .cache/<name>: missing is a failure there, a skip elsewhere."""
    path = ROOT / ".cache" / name / "node_modules" / ".bin" / binary
    if not path.exists():
        if os.environ.get("CHOIR_TEST_AGENTS") == "1":
            pytest.fail(f"{name} is not installed at {path}: run `make {name}`")
        pytest.skip(f"{name} is not installed at {path} (`make {name}` installs it)")
    return path


def start_agent_server(where: Path, key: str) -> Server:
    """Choir on the real engine, set up for an agent's prompts (see above), with the hermes tool parser."""
    (where / "generation").mkdir(exist_ok=True)
    (where / "generation" / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    return start_server(where / "server.log", env={
        "CHOIR_API_KEY": key, "CHOIR_TOOL_PARSER": "hermes", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
        "CHOIR_ENGINE_ARGS": f"--max-model-len 32768 --generation-config {where / 'generation'}"})


def start_scripted_server(where: Path, key: str, tool: str) -> Server:
    """Choir over tests/integration/scripted_agent.py's engine, whose model calls the agent's shell tool `tool`."""
    port = free_port()
    env = {**os.environ, "CHOIR_API_KEY": key, "CHOIR_AGENT_TOOL": tool,
           "CHOIR_STORE_URL": f"sqlite+aiosqlite:///{where / 'store.sqlite3'}"}
    log = where / "server.log"
    process = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory",
                                "tests.integration.scripted_agent:create_app", "--host", "127.0.0.1",
                                "--port", str(port)], cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    return healthy(Server(process, f"http://127.0.0.1:{port}", log))


def answered(server: Server, route: str) -> dict[str, float]:
    """POST answers of one operation so far (`createResponse`, ...), by status (Choir's request counter)."""
    metrics = httpx.get(f"{server.base_url}/metrics").text
    pattern = rf'choir_requests_total\{{method="POST",route="{route}",status="(\d+)"\}} (\S+)'
    return {status: float(count) for status, count in re.findall(pattern, metrics)}


def answered_since(server: Server, route: str, before: dict[str, float]) -> dict[str, float]:
    after = answered(server, route)
    return {status: count - before.get(status, 0) for status, count in after.items() if count > before.get(status, 0)}
