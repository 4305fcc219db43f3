"""`choir serve [MODEL] [FLAGS]` (`make serve`): Choir in one process, in N API processes over one set of engine
cores, or engine cores alone, as `vllm serve` runs them.

- `--api-server-count 1` (the default): uvicorn and the app in this process, which starts the engines in its
  lifespan: the same app as `litestar --app choir.app:create_app run` or `uvicorn --factory choir.app:create_app`.
- `--api-server-count N > 1` (CHOIR_API_SERVERS): this process is a supervisor, as `vllm serve
  --api-server-count N` is: each engine role's cores, then N workers (choir/cli/worker.py), each attached to
  every role's cores as client i of N.
- `--headless`: engine cores only, for a data-parallel head elsewhere (run by vLLM's own code).
"""

import os
import sys
import textwrap
from typing import Any

from choir.cli import flags
from choir.core.settings import Settings, SettingsError, environment
from choir.core.variables import VARIABLES
from choir.engine import backend

HELP = """usage: choir serve [MODEL] [options]

Serve MODEL (a path or a Hugging Face id; default: CHOIR_MODEL, else the bundled tiny model in ./models) with
Choir's OpenAI- and Anthropic-compatible API over vLLM's engine.

Every `vllm serve` option is accepted, read by vLLM's own parser:
  - engine options (--max-model-len, --tensor-parallel-size, --gpu-memory-utilization, ...) reach the engine
    unchanged (after CHOIR_ENGINE_ARGS);
  - front-end options set the Choir setting that does the same:
{mapped};
  - uvicorn's:
{uvicorn};
  - an option Choir cannot honour stops start-up with one line naming it.
  `choir serve --help=all` lists vLLM's options; `--help=Frontend`, `--help=ModelConfig`, ... one group.

Each setting is also an environment variable (CHOIR_*, or a .env file); a flag wins over it.

Choir's own options:
{own}
"""


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if any(arg in ("-h", "--help") for arg in args):
        print(help_text())
        return
    try:
        command = flags.read(args, environment(dict(os.environ)))  # .env under the real environment, flags over both
        settings = Settings.from_env(command.environ)
        run(settings, command.uvicorn)
    except SettingsError as exc:
        print(f"choir: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)


def run(settings: Settings, uvicorn_options: dict[str, Any]) -> None:
    options = dict(uvicorn_options)
    host, port = options.pop("host", None) or "0.0.0.0", options.pop("port", None) or 8000
    if settings.headless or settings.api_servers > 1:
        backend.check_version(settings.environ)  # before vLLM's launchers are imported
    if settings.headless:
        backend.run_headless(settings)
    elif settings.api_servers == 1:
        import uvicorn

        from choir.app.asgi import create_app

        uvicorn.run(create_app(settings), host=host, port=port, log_config=None, access_log=False, **options)
    else:
        if options.get("uds"):
            raise SettingsError("--uds serves one API process: --api-server-count must be 1.")
        sys.exit(supervise(settings, host, port, options))


def supervise(settings: Settings, host: str, port: int, uvicorn_options: dict[str, Any]) -> int:
    """Returns the exit code: 0 after a signal, 1 when a worker died."""
    from choir.app.request_log import configure_logging
    from choir.cli.worker import WorkerArgs, run_worker

    configure_logging(settings.log_level)
    _check_before_engines(settings)
    return backend.supervise(settings, host, port, run_worker,
                             lambda clients: WorkerArgs(settings, uvicorn_options, clients))


def _check_before_engines(settings: Settings) -> None:
    """What every worker would refuse at its start-up (the profile, the parsers' names), refused once here,
    in one line, before any engine starts."""
    from choir.plugins.spec import SpecConfig

    _ = SpecConfig(compat=settings.compat).operation_rules
    backend.check_parser_names(settings.reasoning_parser, settings.tool_parser, settings.parser_plugins)


def help_text() -> str:
    def option(dest: str) -> str:
        return "--" + dest.replace("_", "-")

    def listed(options: list[str]) -> str:
        return textwrap.fill(", ".join(options), width=110, initial_indent=" " * 4, subsequent_indent=" " * 4,
                             break_on_hyphens=False)

    mapped = listed([option(dest) for dest in flags.SETTINGS if dest != "model_tag"])
    own = "\n".join(f"  {flag:<28} {VARIABLES[variable].summary} ({variable})"
                    + (f"; {flag.replace('--', '--no-', 1)} turns it off" if VARIABLES[variable].boolean else "")
                    for flag, variable in flags.CHOIR_FLAGS)
    return HELP.format(mapped=mapped, uvicorn=listed([option(dest) for dest in flags.UVICORN]), own=own)


if __name__ == "__main__":
    main()
