"""`choir-serve` (`make serve`): Choir in one process, or in N API processes over one set of engine cores.

- CHOIR_API_SERVERS=1 (the default): uvicorn and the app in this process, which starts the engines in its
  lifespan: exactly `litestar run` / `uvicorn --factory app.asgi:create_app`.
- CHOIR_API_SERVERS=N > 1 (or `--api-server-count N` in CHOIR_ENGINE_ARGS): this process is a supervisor, as
  `vllm serve --api-server-count N` is (plugins/engine/vllm_supervisor.py): each engine role's cores, then
  N workers (app/worker.py), each attached to every role's cores as client i of N.
- `--headless` in CHOIR_ENGINE_ARGS: engine cores only, for a data-parallel head elsewhere (vLLM's
  `vllm serve --headless`, run by vLLM's own code).
"""

import argparse
import sys
from typing import Any

from core.settings import Settings, SettingsError


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="choir-serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--root-path", default="", help="served below this path (behind a proxy), as uvicorn's")
    options = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
        if settings.headless or settings.api_servers > 1:
            from plugins.engine.vllm_version import check_vllm_version

            check_vllm_version(settings.environ)  # before vLLM's launchers are imported
        if settings.headless:
            from plugins.engine.vllm_supervisor import run_headless

            run_headless(settings)
        elif settings.api_servers == 1:
            import uvicorn

            uvicorn.run("app.asgi:create_app", factory=True, host=options.host, port=options.port,
                        root_path=options.root_path, log_config=None, access_log=False)
        else:
            sys.exit(supervise(settings, options.host, options.port, {"root_path": options.root_path}))
    except SettingsError as exc:
        print(f"choir: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)


def supervise(settings: Settings, host: str, port: int, uvicorn_options: dict[str, Any]) -> int:
    """Returns the exit code: 0 after a signal, 1 when a worker died."""
    from app.request_log import configure_logging
    from app.worker import WorkerArgs, run_worker
    from plugins.engine.vllm_supervisor import supervise as supervise_workers

    configure_logging(settings.log_level)
    _check_before_engines(settings)
    return supervise_workers(settings, host, port, run_worker,
                             lambda clients: WorkerArgs(settings, uvicorn_options, clients))


def _check_before_engines(settings: Settings) -> None:
    """What every worker would refuse at its start-up (the profile, the parsers' names), refused once here,
    in one line, before any engine starts."""
    from plugins.parsers import check_parser_names
    from plugins.spec import SpecConfig

    _ = SpecConfig(compat=settings.compat).operation_rules
    check_parser_names(settings.reasoning_parser, settings.tool_parser)


if __name__ == "__main__":
    main()
