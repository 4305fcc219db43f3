"""Choir over a scripted engine that behaves as a coding agent's model: asked anything, it calls the agent's
shell tool to run `echo {MARK}` (a hermes tool call, as the bundled tokenizer spells it); once the command's
output is in the conversation, it answers in text. Served by uvicorn in a process of its own:

    CHOIR_AGENT_TOOL=exec_command uvicorn --factory tests.integration.scripted_agent:create_app

CHOIR_AGENT_TOOL names the agent's shell tool (SHELL_TOOLS: its name and arguments); CHOIR_API_KEY and the other
settings come from the environment; the tool parser is hermes."""

import json
import os
from pathlib import Path

from litestar import Litestar

from choir.app.asgi import create_app as create_choir
from choir.core.settings import BUNDLED_MODEL_DIR, Settings
from tests.fakes import FakeEngine, fake_engine_factory

MARK = "choir-agent-tool-ran"
# Each agent's shell tool: the arguments that run `echo MARK` (Codex: exec_command; opencode: bash; Qwen Code:
# run_shell_command).
SHELL_TOOLS = {"exec_command": {"cmd": f"echo {MARK}"},
               "bash": {"command": f"echo {MARK}", "description": "Prints a mark"},
               "run_shell_command": {"command": f"echo {MARK}", "description": "Prints a mark"}}


def create_app() -> Litestar:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(BUNDLED_MODEL_DIR))

    def pieces(text: str) -> list[str]:
        return [tokenizer.decode([token]) for token in tokenizer.encode(text, add_special_tokens=False)]

    tool = os.environ.get("CHOIR_AGENT_TOOL", "exec_command")
    call = f"<tool_call>\n{json.dumps({'name': tool, 'arguments': SHELL_TOOLS[tool]})}\n</tool_call>"

    def script(prompt: str, params: object) -> list[str]:
        # The command's output (the tool message) in the prompt: the turn is done
        return pieces("The command printed it. Done.") if f"{MARK}\n" in prompt else pieces(call)

    engine = FakeEngine(script=script, served_model_names=("choir-tiny",), max_model_len=131072, tokenizer=tokenizer)
    settings = Settings.from_env({**os.environ, "CHOIR_TOOL_PARSER": "hermes", "CHOIR_SERVED_MODEL_NAME": "choir-tiny"},
                                 env_file=Path(os.devnull))  # not a developer's .env
    return create_choir(settings, engine_factory=fake_engine_factory(engine))
