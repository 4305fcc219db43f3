"""`choir batch -i requests.jsonl -o results.jsonl [MODEL] [vllm serve's options]`: a Batch API input file run
offline, as vLLM's `run_batch` runs one: the engine started in this process, each line sent through Choir's own
endpoints (so it answers as the server would), a bounded number at a time, with a progress bar; one result line
per request, in the input's order, in the output file (errors too, each with its status and error). A bad input
file is refused, each bad line named, before anything is run."""

import argparse
import asyncio
import dataclasses
import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from choir.cli import flags
from choir.core.settings import Settings, SettingsError, environment

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")


def parser() -> argparse.ArgumentParser:
    command = argparse.ArgumentParser(
        prog="choir batch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Every other option is `choir serve`'s (the model, the engine's flags); see `choir serve --help`.")
    command.add_argument("-i", "--input-file", required=True, type=Path, help="the requests, one JSON line each")
    command.add_argument("-o", "--output-file", required=True, type=Path, help="where the results go")
    command.add_argument("--max-concurrency", type=int, default=16,
                         help="requests in the engine at a time (default: 16)")
    return command


def main(argv: list[str]) -> None:
    known, rest = parser().parse_known_args(argv)
    try:
        command = flags.read(rest, environment(dict(os.environ)))
        settings = Settings.from_env(command.environ)
    except SettingsError as exc:
        raise SystemExit(f"choir batch: {exc}") from None
    if known.max_concurrency < 1:
        raise SystemExit("choir batch: --max-concurrency must be 1 or more")
    try:
        content = known.input_file.read_bytes()
    except OSError as exc:
        raise SystemExit(f"choir batch: the input file cannot be read: {exc}") from None
    failed = asyncio.run(run_file(settings, content, known.output_file, known.max_concurrency))
    sys.exit(1 if failed is None else 0)


async def run_file(settings: Settings, content: bytes, output: Path, concurrency: int,
                   engine_factory: Any = None, progress: bool = True) -> int | None:
    """The requests of `content` answered into `output`: how many failed, or None when the file was refused."""
    from choir.app.asgi import create_app
    from choir.app.serving.batch_input import read_requests
    from choir.app.serving.batch_runner import answer_line, dispatch

    endpoints = {url if isinstance(url := line.get("url"), str) else None for line in _objects(content)}
    endpoint = next(iter(endpoints)) if len(endpoints) == 1 else None
    if endpoint not in ENDPOINTS:
        print(f"choir batch: every line's `url` must be one endpoint of {', '.join(ENDPOINTS)}",
              file=sys.stderr)
        return None
    assert isinstance(endpoint, str)
    requests, errors = read_requests(content, endpoint)
    if errors:
        for error in errors:
            print(f"choir batch: line {error.line}: {error.message}" if error.line else f"choir batch: "
                  f"{error.message}", file=sys.stderr)
        return None
    app = create_app(dataclasses.replace(settings, store_url=None, docs=False), engine_factory=engine_factory)
    bar = _bar(len(requests)) if progress else None
    gate = asyncio.Semaphore(concurrency)
    results: dict[int, tuple[bool, dict[str, Any]]] = {}

    async def one(request: Any) -> None:
        async with gate:
            status, request_id, body = await dispatch(app, endpoint, json.dumps(request.body).encode(), "",
                                                      f"batch_req_{secrets.token_hex(12)}")
        results[request.line] = answer_line(request, status, request_id, body)
        if bar is not None:
            bar.update(1)

    async with app.lifespan():
        await asyncio.gather(*(one(request) for request in requests))
    if bar is not None:
        bar.close()
    with output.open("w") as out:
        for request in requests:
            out.write(json.dumps(results[request.line][1]) + "\n")
    return sum(not ok for ok, _ in results.values())


def _objects(content: bytes) -> list[dict[str, Any]]:
    found = []
    for raw in content.decode("utf-8-sig", errors="replace").split("\n"):
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict):
            found.append(line)
    return found


def _bar(total: int) -> Any:
    try:
        from tqdm import tqdm  # type: ignore[import-untyped]  # vLLM's dependency, as its run_batch uses it
    except ImportError:
        return None
    return tqdm(total=total, desc="choir batch", unit="req", file=sys.stderr)
