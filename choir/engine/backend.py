"""The one door to the engine implementation behind the seam: vLLM's adapter (choir/engine/vllm/), imported
here lazily (vLLM imports torch: seconds), and nowhere else outside the adapter (pyproject's
[tool.importlinter]: a `protected` contract). The command line, the API processes, the engine roles and the
parsers plugin start and ask vLLM through these functions."""

import argparse
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from choir.core.settings import RoleModel, Settings
from choir.engine.protocol import Engine, PoolingEngine


@dataclass(frozen=True)
class ServeArgs:
    """A `serve` command line as vLLM's parser read it."""

    values: argparse.Namespace  # every option's value (defaults included)
    given: tuple[tuple[str, tuple[str, ...]], ...]  # (dest, its tokens) for each option given, in order


def start_role(settings: Settings, model: RoleModel,
               client: dict[str, Any] | None = None) -> AbstractAsyncContextManager[Engine | PoolingEngine]:
    """The engine of any role, started here, or attached to engine cores a supervisor started (`client`:
    this API process's vLLM client config)."""
    from choir.engine.vllm.start import start_vllm_role

    return start_vllm_role(settings, model, client)


def check_parser_names(reasoning: str | None, tool: str | None, plugins: tuple[str, ...] = ()) -> None:
    """SettingsError naming the parsers vLLM knows, for a name it lacks (before any engine starts), after
    importing the parser plugins (files that register parsers of their own) in this process."""
    from choir.engine.vllm.parsers import parser_classes

    parser_classes(reasoning, tool, plugins)


def check_version(environ: Mapping[str, str]) -> None:
    """Stops start-up, in one line, on a vLLM other than the one Choir is built for."""
    from choir.engine.vllm.version import check_vllm_version

    check_vllm_version(environ)


def supervise(settings: Settings, host: str, port: int, run_worker: Callable[..., None],
              worker_args: Callable[[dict[str, list[dict[str, Any]]]], Any]) -> int:
    """N API processes over one set of engine cores per role; the exit code."""
    from choir.engine.vllm.supervisor import supervise as supervise_workers

    return supervise_workers(settings, host, port, run_worker, worker_args)


def run_headless(settings: Settings) -> None:
    """Engine cores only, for a data-parallel head elsewhere."""
    from choir.engine.vllm.supervisor import run_headless as headless

    headless(settings)


def name_process(name: str, index: int) -> None:
    from choir.engine.vllm.supervisor import name_process as named

    named(name, index)


def serve_parser(prog: str, add_own: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    """`vllm serve`'s parser (vLLM's own), with the options `add_own` adds."""
    from choir.engine.vllm import cli

    return cli.serve_parser(prog, add_own)


def parse_serve_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> ServeArgs:
    from choir.engine.vllm import cli

    values, given = cli.parse_serve_args(parser, argv)
    return ServeArgs(values, tuple(given))


def check_serve_args(values: argparse.Namespace) -> None:
    """vLLM's own checks of a command line; ValueError saying what is wrong."""
    from choir.engine.vllm import cli

    cli.check_serve_args(values)


def engine_dests() -> frozenset[str]:
    """The options the engine takes (each reaches it unchanged)."""
    from choir.engine.vllm import cli

    return cli.engine_dests()


def frontend_dests() -> frozenset[str]:
    """The options of vLLM's own HTTP server."""
    from choir.engine.vllm import cli

    return cli.frontend_dests()
