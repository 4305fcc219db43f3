"""The agent programs on Choir and on `vllm serve`, side by side: Claude Code (`claude -p`, the Messages API), the
Codex CLI (`codex exec`, the Responses API), opencode (`opencode run`) and Qwen Code (`qwen`, both chat
completions), each the release `make test` installs into .cache/, each sent one turn ("Say hi.") and the same
turn with a wrong key.

Both servers serve the bundled tiny model set up for an agent's long prompt as the tests set it up
(tests/integration/agent_servers.py: a 32k context, `<pad>` a second end token), with the hermes tool parser and an
API key; vLLM's with `--enable-auto-tool-choice` too. The table "Agent programs on Choir and on vLLM" in
docs/agents.md is built from its output.

    .venv/bin/python -m conformance.agents [--out FILE]
"""

import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

from benchmarks.frontends import engine_flags
from conformance import side_by_side
from tests.integration.agent_servers import installed, start_agent_server
from tests.integration.server import Server, start_vllm_server
from tests.integration.test_agents import run_opencode, run_qwen
from tests.integration.test_claude_code import run_claude
from tests.integration.test_codex import run_codex

KEY = "side-by-side-key"
Run = Callable[[Server, Path, str], CompletedProcess]


def claude(server: Server, where: Path, key: str) -> CompletedProcess:
    return run_claude(installed("claude-code", "claude"), server, where, "--output-format", "json",
                      ANTHROPIC_API_KEY=key, CLAUDE_CODE_MAX_RETRIES="0")


def codex(server: Server, where: Path, key: str) -> CompletedProcess:
    return run_codex(installed("codex", "codex"), server, where / "home", "Say hi.", key=key)


def opencode(server: Server, where: Path, key: str) -> CompletedProcess:
    return run_opencode(installed("opencode", "opencode"), server, where, "Say hi.", key=key)


def qwen(server: Server, where: Path, key: str) -> CompletedProcess:
    return run_qwen(installed("qwen-code", "qwen"), server, where, "Say hi.", key=key)


PROGRAMS: dict[str, Run] = {"Claude Code 2.1.332": claude, "Codex CLI 0.171.0": codex, "opencode 1.18.33": opencode,
                            "Qwen Code 0.24.4": qwen}
CASES = [(f"{name}: {what}", what) for name in PROGRAMS for what in ("one turn", "wrong key")]


def run_cases(server: Server) -> dict[str, str]:
    results = {}
    for name, run in PROGRAMS.items():
        for what, key in (("one turn", KEY), ("wrong key", "wrong")):
            where = Path(tempfile.mkdtemp(prefix="agent-"))
            done = run(server, where, key)
            (where / "output.txt").write_text(f"exit {done.returncode}\n{done.stdout}\n{done.stderr}")
            results[f"{name}: {what}"] = outcome(done)
    return results


def outcome(done: CompletedProcess) -> str:
    """The exit status, and for a failure the program's own words for it: its first error message (Codex's
    warning that it has no metadata for the model's name is not one)."""
    if done.returncode == 0:
        return "exit 0"
    text = done.stdout + "\n" + done.stderr
    said = [json.loads(f'"{found}"') for found in MESSAGE.findall(text)]
    why = next((message for message in said if "Model metadata" not in message), text.strip()[-120:])
    return f"exit {done.returncode}: {why[:140]!r}".replace("|", "/")


MESSAGE = re.compile(r'"(?:message|result|error)"\s*:\s*"((?:\\.|[^"\\])*)"')


def start_choir(log: Path) -> Server:
    where = log.with_suffix("")
    where.mkdir()
    return start_agent_server(where, KEY)


def start_vllm(log: Path) -> Server:
    where = log.with_suffix("")
    (where / "generation").mkdir(parents=True)
    (where / "generation" / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    return start_vllm_server(log, [*engine_flags(), "--max-model-len", "32768", "--generation-config",
                                   str(where / "generation"), "--api-key", KEY, "--enable-auto-tool-choice",
                                   "--tool-call-parser", "hermes"])


def main() -> None:
    out = side_by_side.out_path(__doc__.splitlines()[0])
    results, seconds = side_by_side.compare("agents", start_choir, start_vllm, run_cases)
    lines = side_by_side.table(CASES, results)
    side_by_side.publish([*lines, "", f"({len(CASES)} cases, {seconds:.0f} s)"], out)


if __name__ == "__main__":
    main()
