"""`vllm serve`'s command line, read by vLLM's own parser (make_arg_parser: the model, the front end's options,
every engine option), with Choir's own options beside them. What it gives back keeps each option's tokens as the
user wrote them (after vLLM's own rewriting: `--config FILE` expanded, `_` spelt `-`, dotted `--x.y v` folded into
`--x JSON`), so that engine options reach the engine's parser unchanged."""

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

# The positional model of `vllm serve MODEL`; `--model` is the engine's option of the same meaning.
MODEL_TAG = "model_tag"


def serve_parser(prog: str, add_own: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    """vLLM's `vllm serve` parser, with the options `add_own` adds (a clash with vLLM's is argparse's error)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Parser(FlexibleArgumentParser):
        """Keeps the tokens vLLM's rewriting hands to argparse."""

        rewritten: list[str] = []

        def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
            self.rewritten = list(args or [])
            return super().parse_known_args(args, namespace)

    parser = make_arg_parser(Parser(prog=prog, usage=f"{prog} [MODEL] [options]"))
    add_own(parser)
    return parser


def parse_serve_args(parser: argparse.ArgumentParser,
                     argv: Sequence[str]) -> tuple[argparse.Namespace, list[tuple[str, tuple[str, ...]]]]:
    """Parsed as `vllm serve` parses (argparse's usage and exit 2 on a bad option): every option's value
    (defaults included), and each option given with its tokens, in order."""
    values = parser.parse_args(list(argv))
    return values, _split(parser, getattr(parser, "rewritten", list(argv)))


def engine_dests() -> frozenset[str]:
    """The options vLLM's engine takes (AsyncEngineArgs' fields)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return frozenset(field.name for field in dataclasses.fields(AsyncEngineArgs))


def frontend_dests() -> frozenset[str]:
    """The options of vLLM's own HTTP server (FrontendArgs' fields)."""
    from vllm.entrypoints.launchers.cli_args import FrontendArgs

    return frozenset(field.name for field in dataclasses.fields(FrontendArgs))


def check_serve_args(values: argparse.Namespace) -> None:
    """vLLM's own checks of a `vllm serve` command line (its chat template, ...); ValueError on a bad one."""
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

    try:
        validate_parsed_serve_args(values)
    except Exception as exc:  # vLLM's own types (VLLMValidationError, TypeError, FileNotFoundError)
        raise ValueError(str(exc)) from None


def _split(parser: argparse.ArgumentParser, tokens: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """Each option and the tokens it took, as argparse takes them: a value after `=` or glued to a short option,
    else as many following tokens as its `nargs` asks for. The first stray value is the positional model."""
    parse_optional: Callable[[str], Any] = parser._parse_optional
    split: list[tuple[str, tuple[str, ...]]] = []
    i = 0
    while i < len(tokens):
        found = parse_optional(tokens[i]) if tokens[i] != "--" else None
        if found is None or found[0] is None:
            if tokens[i] != "--":
                split.append((MODEL_TAG, (tokens[i],)))
            i += 1
            continue
        action, option, explicit = found
        if explicit is not None:
            split.append((action.dest, (f"{option}={explicit}",)))
            i += 1
            continue
        values = _values(parser, action, tokens[i + 1:])
        split.append((action.dest, (option, *values)))
        i += 1 + len(values)
    return split


def _values(parser: argparse.ArgumentParser, action: argparse.Action, rest: list[str]) -> list[str]:
    def is_value(token: str) -> bool:
        if token == "--":
            return False
        found = parser._parse_optional(token)
        return found is None

    nargs = action.nargs
    if nargs == 0:
        return []
    if nargs is None:
        return rest[:1]
    if isinstance(nargs, int):
        return rest[:nargs]
    taken: list[str] = []
    for token in rest:
        if not is_value(token) or (nargs == "?" and taken):
            break
        taken.append(token)
    return taken
