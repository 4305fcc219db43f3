"""Choir and `vllm serve` side by side, for the conformance scripts that compare them on one kind of request
(anthropic.py, images.py; each starts `vllm serve` on Choir's engine flags): each server in turn (two CPU engines
at once would share two cores), the same cases sent to each, one Markdown table printed (and written with --out).
"""

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tests.integration.server import Server

Result = TypeVar("Result")


def compare(name: str, start_choir: Callable[[Path], Server], start_vllm: Callable[[Path], Server],
            run_cases: Callable[[Server], Result]) -> tuple[dict[str, Result], float]:
    """Each server's results ("Choir", "vLLM"), and the seconds it all took."""
    logs = Path(tempfile.mkdtemp(prefix=f"{name}-side-by-side-"))
    began = time.monotonic()
    results = {}
    for server_name, start in (("Choir", start_choir), ("vLLM", start_vllm)):
        print(f"starting {server_name} (log in {logs})", file=sys.stderr)
        server = start(logs / f"{server_name.lower()}.log")
        try:
            results[server_name] = run_cases(server)
        finally:
            server.stop()
    return results, time.monotonic() - began


def run_each(server: Server, cases: Sequence[tuple[str, Callable[[str], httpx.Response]]],
             describe: Callable[[httpx.Response], list[str]]) -> dict[str, str]:
    """Each case's reply (its request sent to the server's base URL) as facts; /health after the last."""
    results = {}
    for name, send in cases:
        try:
            facts = describe(send(server.base_url))
        except httpx.HTTPError as exc:
            facts = [f"**no answer** ({type(exc).__name__})"]
        results[name] = "<br>".join(facts)
    results[cases[-1][0]] += f"<br>/health {httpx.get(f'{server.base_url}/health', timeout=10).status_code}"
    return results


def out_path(description: str) -> Path | None:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, help="also write the table here")
    return parser.parse_args().out


def publish(lines: list[str], out: Path | None) -> None:
    table = "\n".join(lines) + "\n"
    print(table)
    if out:
        out.write_text(table)


def table(cases: Sequence[Sequence[Any]], results: dict[str, dict[str, Result]],
          cell: Callable[[Result], str] = str) -> list[str]:
    """One row a case (its name and what it asks, first in each of `cases`): what each server answered."""
    lines = ["| case | request | Choir | vLLM 0.32 |", "|---|---|---|---|"]
    return lines + [f"| {case[0]} | {case[1]} | {cell(results['Choir'][case[0]])} | {cell(results['vLLM'][case[0]])} |"
                    for case in cases]
