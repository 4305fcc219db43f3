"""pytest plugin (`-p conformance.plugin`) that runs vLLM's server-talking OpenAI tests against Choir, or
against `vllm serve` for the baseline.

- `tests.utils.RemoteOpenAIServer` becomes `SuiteServer`: the test's `vllm serve` flags translated
  (`conformance.servers.translate`), the server started from Choir (`CONFORMANCE_MODE=choir`) or from vLLM
  (`vllm`), on the bundled model. Servers live in one pool: one at a time, each config started on its first
  use in a module and reused by every fixture or test of the module that asks for it, stopped at the
  module's end. Within a module, tests are grouped by the values of their parametrized fixtures (so that
  tests picking one of two servers through a fixture parameter do not switch servers at each test).
- Tests that never reach a server (unit tests of vLLM's serving classes beside the server tests) are
  deselected: a test talks to a server when it, or a fixture it uses, names `RemoteOpenAIServer`.
- Every test's HTTP exchanges (request and answer, shortened) and outcome go to the JSON report
  (`CONFORMANCE_REPORT`), which `python -m conformance` checks against expected.yaml.

Configured by the environment `python -m conformance` sets: CONFORMANCE_MODE, CONFORMANCE_REPORT,
CONFORMANCE_LOGS, CONFORMANCE_SELECTION, CONFORMANCE_SOURCE (the folder holding the sdist's `tests/`).
"""

import atexit
import inspect
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from conformance.servers import Pool, ServerConfig, Settings, translate
from conformance.source import short

MODE = os.environ.get("CONFORMANCE_MODE", "choir")
if MODE not in ("choir", "vllm"):
    raise pytest.UsageError(f"CONFORMANCE_MODE={MODE!r}: choir or vllm")
SOURCE = Path(os.environ.get("CONFORMANCE_SOURCE", os.getcwd())).resolve()
REPORT = Path(os.environ.get("CONFORMANCE_REPORT", "conformance-report.json"))
SELECTION = yaml.safe_load(Path(os.environ.get(
    "CONFORMANCE_SELECTION", Path(__file__).with_name("selection.yaml"))).read_text())
SETTINGS = Settings(
    engine_args=tuple(SELECTION["engine_args"]),
    replaced_flags=frozenset(SELECTION["replaced_flags"]),
    base_model=SELECTION["base_model"],
    models={repo: local for local, repos in SELECTION["models"].items() for repo in repos},
)
POOL = Pool(Path(os.environ.get("CONFORMANCE_LOGS", "conformance-logs")) / MODE)
atexit.register(POOL.stop)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # pytest ends the session (the pool's server stopped, the report written)


signal.signal(signal.SIGTERM, _interrupt)

MAX_EXCHANGES = 24
MAX_BODY = 1500
_current: list[dict] | None = None  # the running test's exchanges
_results: dict[str, dict[str, Any]] = {}


class SuiteServer:
    """Stands in for vLLM's RemoteOpenAIServer (same constructor, same client helpers). The server starts
    when the handle is first used, not when it is made (a fixture that makes two servers and uses one
    starts one); its address is looked up on each use, so a handle stays good while the pool runs another
    config in between."""

    DUMMY_API_KEY = "token-abc123"

    def __init__(self, model: str, vllm_serve_args: list[str], *, env_dict: dict[str, str] | None = None,
                 seed: int | None = 0, auto_port: bool = True, max_wait_seconds: float | None = None,
                 override_hf_configs: dict[str, Any] | None = None, **_: Any) -> None:
        args = list(vllm_serve_args)
        if seed is not None and "--seed" not in args:
            args += ["--seed", str(seed)]
        self.model = model
        self.config: ServerConfig = translate(MODE, SETTINGS, model, args, env_dict)
        self.uds = None
        self.show_hidden_metrics = False

    def __enter__(self) -> "SuiteServer":
        return self

    def __exit__(self, *exc: object) -> None:
        """The pool stops servers at the module's end."""

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        return POOL.acquire(self.config).port

    @property
    def url_root(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_for(self, *parts: str) -> str:
        path = "/".join(part.strip("/") for part in parts if part)
        return f"{self.url_root}/{path}"

    def get_client(self, **kwargs: Any) -> Any:
        import openai

        kwargs.setdefault("timeout", 600)
        return openai.OpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs)

    def get_async_client(self, **kwargs: Any) -> Any:
        import openai

        kwargs.setdefault("timeout", 600)
        return openai.AsyncOpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0,
                                  **kwargs)

    def get_client_anthropic(self, **kwargs: Any) -> Any:
        import anthropic

        kwargs.setdefault("timeout", 600)
        return anthropic.Anthropic(base_url=self.url_for(), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs)

    def get_async_client_anthropic(self, **kwargs: Any) -> Any:
        import anthropic

        kwargs.setdefault("timeout", 600)
        return anthropic.AsyncAnthropic(base_url=self.url_for(), api_key=self.DUMMY_API_KEY, max_retries=0,
                                        **kwargs)


def _patch_vllm_tests() -> None:
    """Before any test module or conftest imports them: vLLM's server helper, and the download helper a
    test calls directly (resolved in the offline cache that maps the tests' models to the bundled ones)."""
    if str(SOURCE) not in sys.path:
        sys.path.insert(0, str(SOURCE))
    import vllm.model_executor.model_loader.weight_utils as weight_utils

    import tests.utils as vllm_test_utils

    for name in ("RemoteOpenAIServer", "RemoteOpenAIServerCustom"):
        setattr(vllm_test_utils, name, SuiteServer)

    def download_weights_from_hf(model_name_or_path: str, *args: Any, **kwargs: Any) -> str:
        from huggingface_hub import snapshot_download

        return snapshot_download(model_name_or_path, local_files_only=True)

    weight_utils.download_weights_from_hf = download_weights_from_hf  # type: ignore[assignment]


# --- HTTP exchanges -------------------------------------------------------------------------------------


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return text if len(text) <= MAX_BODY else text[:MAX_BODY] + f"... [{len(text)} chars]"


def _record(method: str, url: str, body: bytes | str | None) -> dict | None:
    if _current is None or len(_current) >= MAX_EXCHANGES:
        return None
    parsed = httpx.URL(str(url))
    if parsed.host not in ("127.0.0.1", "localhost"):  # the servers only (not the Hugging Face hub)
        return None
    entry = {"request": f"{method} {parsed.raw_path.decode()}", "body": _text(body)}
    _current.append(entry)
    return entry


def _tees(module: Any) -> tuple[type, type]:
    """Stream wrappers (of `module`'s stream classes: httpx or its fork httpx2) that keep the first bytes."""

    class AsyncTee(module.AsyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, inner: Any, entry: dict) -> None:
            self._inner, self._entry, self._seen = inner, entry, bytearray()

        async def __aiter__(self):  # type: ignore[no-untyped-def]
            async for chunk in self._inner:
                if len(self._seen) <= MAX_BODY:
                    self._seen += chunk
                    self._entry["answer"] = _text(bytes(self._seen))
                yield chunk

        async def aclose(self) -> None:
            await self._inner.aclose()

    class SyncTee(module.SyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, inner: Any, entry: dict) -> None:
            self._inner, self._entry, self._seen = inner, entry, bytearray()

        def __iter__(self):  # type: ignore[no-untyped-def]
            for chunk in self._inner:
                if len(self._seen) <= MAX_BODY:
                    self._seen += chunk
                    self._entry["answer"] = _text(bytes(self._seen))
                yield chunk

        def close(self) -> None:
            self._inner.close()

    return AsyncTee, SyncTee


def _patch_httpx(module: Any) -> None:
    async_tee, sync_tee = _tees(module)
    async_send, sync_send = module.AsyncClient.send, module.Client.send

    async def send_async(self: Any, request: Any, **kwargs: Any) -> Any:
        entry = _record(request.method, str(request.url), request.content)
        response = await async_send(self, request, **kwargs)
        if entry is not None:
            entry["status"] = response.status_code
            if kwargs.get("stream"):
                response.stream = async_tee(response.stream, entry)
            else:
                entry["answer"] = _text(response.content)
        return response

    def send_sync(self: Any, request: Any, **kwargs: Any) -> Any:
        entry = _record(request.method, str(request.url), request.content)
        response = sync_send(self, request, **kwargs)
        if entry is not None:
            entry["status"] = response.status_code
            if kwargs.get("stream"):
                response.stream = sync_tee(response.stream, entry)
            else:
                entry["answer"] = _text(response.content)
        return response

    module.AsyncClient.send = send_async
    module.Client.send = send_sync


def _patch_http() -> None:
    """Record what each test sends and what the server answers: httpx, and httpx2 (the OpenAI SDK's), and
    requests."""
    import importlib

    import requests

    for name in ("httpx", "httpx2"):
        try:
            _patch_httpx(importlib.import_module(name))
        except ImportError:
            continue
    requests_send = requests.Session.send

    def send_requests(self: Any, request: Any, **kwargs: Any) -> Any:
        entry = _record(request.method, request.url, request.body)
        response = requests_send(self, request, **kwargs)
        if entry is not None:
            entry["status"] = response.status_code
            if not kwargs.get("stream"):
                entry["answer"] = _text(response.content)
        return response

    requests.Session.send = send_requests  # type: ignore[method-assign]


_patch_vllm_tests()
_patch_http()


# --- pytest hooks -----------------------------------------------------------------------------------------


def _names_server(obj: Any) -> bool:
    try:
        return "RemoteOpenAIServer" in inspect.getsource(obj)
    except (OSError, TypeError):
        return False


def talks_to_server(item: pytest.Item) -> bool:
    """The test, or a fixture in its closure, starts a server."""
    function = getattr(item, "function", None)
    if function is not None and _names_server(function):
        return True
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(_names_server(d.func) for defs in info.name2fixturedefs.values() for d in defs)


def _fixture_params(item: pytest.Item) -> tuple[tuple[int, str, str], ...]:
    """The values of the item's parametrized fixtures (which may pick one of a module's servers), the
    wider-scoped first (pytest's own grouping of module-scoped parameters stays)."""
    callspec = getattr(item, "callspec", None)
    names = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if callspec is None:
        return ()
    rank = {"session": 0, "package": 1, "module": 2, "class": 3, "function": 4}
    keyed = [(rank.get(str(names[k][-1].scope), 4), k, repr(v)) for k, v in callspec.params.items()
             if k in names and names[k][-1].func.__name__ != "get_direct_param_fixture_func"]  # not plain params
    return tuple(sorted(keyed))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect tests that reach no server; within a module, group the tests by the values of their
    parametrized fixtures (stable otherwise), so that tests choosing among a module's servers through
    one (`client` with params) do not switch servers at each test: one server runs at a time."""
    kept, dropped = [], []
    for item in items:
        (kept if talks_to_server(item) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    modules: dict[str | None, list[pytest.Item]] = {}
    for item in kept:
        modules.setdefault(_module(item), []).append(item)
    items[:] = [item for group in modules.values() for item in sorted(group, key=_fixture_params)]


def _module(item: pytest.Item | None) -> str | None:
    return None if item is None else item.nodeid.split("::")[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    global _current
    if _module(item) != POOL.label:
        POOL.clear(_module(item) or "")
    _current = []
    began = time.monotonic()
    yield
    result = _results.setdefault(item.nodeid, {"outcome": "incomplete"})  # interrupted before its call
    result["seconds"] = round(time.monotonic() - began, 2)
    result["exchanges"] = _current
    _current = None
    if _module(nextitem) != _module(item):
        POOL.stop()  # after the module's fixtures are finalized (teardown of its last test)


def _message(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return short(crash.message, 600)
    if isinstance(report.longrepr, tuple):  # a skip: (path, line, reason)
        return short(str(report.longrepr[2]), 600)
    return short(str(report.longrepr), 600)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    result = _results.setdefault(report.nodeid, {"outcome": "incomplete"})
    if report.passed and report.when == "call" and result["outcome"] == "incomplete":
        result["outcome"] = "passed"
    elif report.skipped and result["outcome"] == "incomplete":
        if hasattr(report, "wasxfail"):
            result.update(outcome="xfailed", message=short(report.wasxfail))
        else:
            result.update(outcome="skipped", message=_message(report))
    elif report.failed:
        outcome = "failed" if report.when == "call" else "error"
        if result["outcome"] not in ("failed", "error"):
            result.update(outcome=outcome, when=report.when, message=_message(report))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    POOL.stop()
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps({"mode": MODE, "exit_status": int(exitstatus), "servers": POOL.started,
                                  "tests": _results}, indent=1))
