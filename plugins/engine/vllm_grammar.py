"""The grammar gate: no one request's output constraint may hold the engine's grammar compiler for long.

vLLM compiles each request's grammar (a JSON schema, a structural tag, a regex, an EBNF grammar, a choice)
in its engine core, on a pool of (CPUs + 1) // 2 threads: one on a 2-core machine. A 25,000-property
schema holds a thread for minutes, every constrained request behind it waits, and a request whose client
left keeps compiling: threads cannot be stopped. So before a large constraint reaches the engine, Choir
compiles it once itself, with vLLM's own backend, in a compiler process of its own, against a time budget:
- over CHOIR_MAX_GRAMMAR_BYTES: a 400 at once;
- not compiled within CHOIR_GRAMMAR_COMPILE_SECONDS: a 400, and the process is killed (a new one starts);
- the client leaves (the request is cancelled) while it compiles: the process is killed, its place free;
- compiled in time: sent on; the engine's own compile then takes about as long, within the budget.
Constraints compiled once are remembered (a digest), so a schema sent again goes straight on; small ones
(under PREFLIGHT_FROM_BYTES) always do. Constrained requests that are small never wait for a large one:
they skip the compiler processes, and the engine's compile pool is never held past the budget.
"""

import asyncio
import hashlib
import multiprocessing
import time
from collections import OrderedDict
from multiprocessing.connection import Connection
from typing import Any

import structlog

from core.errors import EngineRejected, stopped_by_server

log = structlog.get_logger("choir.grammar")

PREFLIGHT_FROM_BYTES = 4096  # smaller constraints compile in milliseconds
REMEMBERED = 4096  # digests of constraints that compiled in time
PROCESS_TITLE = "choir::GrammarCompiler"


class GrammarGate:
    def __init__(self, vllm_config: Any, max_bytes: int, budget_seconds: int, compilers: int) -> None:
        self.vllm_config, self.max_bytes, self.budget = vllm_config, max_bytes, budget_seconds
        self._slots = asyncio.Semaphore(compilers)
        self._idle: list[_Compiler] = []
        self._busy: set[_Compiler] = set()
        self._passed: OrderedDict[bytes, None] = OrderedDict()
        self._pending: dict[bytes, asyncio.Future[None]] = {}
        self._waiters: dict[bytes, int] = {}
        self.closed = False

    async def admit(self, structured: Any) -> None:
        """Returns when `structured` (vLLM's StructuredOutputsParams) may go to the engine; raises
        EngineRejected (400) when it may not."""
        from vllm.v1.structured_output.backend_types import StructuredOutputOptions
        from vllm.v1.structured_output.request import get_structured_output_key

        kind, spec = get_structured_output_key(structured)
        size = len(spec.encode())
        what = kind.name.lower().replace("_", " ")
        if size > self.max_bytes:
            raise EngineRejected(f"The output constraint ({what}) is {size:,} bytes; this server compiles at most "
                                 f"{self.max_bytes:,} (CHOIR_MAX_GRAMMAR_BYTES).")
        if kind is StructuredOutputOptions.JSON_OBJECT or size < PREFLIGHT_FROM_BYTES:
            return
        digest = hashlib.sha256(f"{kind.name}:{spec}".encode()).digest()
        if digest in self._passed:
            self._passed.move_to_end(digest)
            return
        pending = self._pending.get(digest)
        if pending is None:  # the children of one n > 1 request share one compile
            pending = self._pending[digest] = asyncio.ensure_future(self._compile(kind, spec, what))
            pending.add_done_callback(lambda _: self._pending.pop(digest, None))
        # shield: one waiter that leaves must not stop the compile the others wait on; the last one does.
        self._waiters[digest] = self._waiters.get(digest, 0) + 1
        try:
            await asyncio.shield(pending)
        finally:
            self._waiters[digest] -= 1
            if not self._waiters[digest]:
                del self._waiters[digest]
                pending.cancel()  # a no-op once it is done
        self._passed[digest] = None
        if len(self._passed) > REMEMBERED:
            self._passed.popitem(last=False)

    async def _compile(self, kind: Any, spec: str, what: str) -> None:
        await self._slots.acquire()
        starting: asyncio.Future[_Compiler] | None = None
        try:
            if self.closed:
                raise stopped_by_server()
            if self._idle:
                compiler = self._idle.pop()
            else:
                starting = asyncio.ensure_future(asyncio.to_thread(_Compiler, self.vllm_config))
                compiler = await asyncio.shield(starting)
                starting = None
            await self._run(compiler, kind, spec, what)
        finally:
            if starting is None:
                self._slots.release()
            else:  # cancelled while it starts (seconds): it keeps the place until it is up, then waits idle
                starting.add_done_callback(self._started)

    def _started(self, starting: asyncio.Future["_Compiler"]) -> None:
        if not starting.cancelled() and starting.exception() is None:
            if self.closed:
                starting.result().kill()
            else:
                self._idle.append(starting.result())
        self._slots.release()

    async def _run(self, compiler: "_Compiler", kind: Any, spec: str, what: str) -> None:
        self._busy.add(compiler)
        started, kept = time.perf_counter(), False
        try:
            outcome = await asyncio.wait_for(compiler.compile(kind, spec), self.budget)
            kept = True
        except TimeoutError:
            log.warning("grammar refused", kind=what, bytes=len(spec), seconds=self.budget)
            raise EngineRejected(
                f"The output constraint ({what}, {len(spec):,} bytes) did not compile within {self.budget} s "
                "(CHOIR_GRAMMAR_COMPILE_SECONDS): make it smaller (fewer properties, less nesting, shorter "
                "alternatives).") from None
        except EOFError:  # the compiler died on it (so would the engine's), or the server stops (close)
            if self.closed:
                raise stopped_by_server() from None
            raise EngineRejected(f"The output constraint ({what}) cannot be compiled: the grammar compiler "
                                 "crashed on it.") from None
        finally:
            self._busy.discard(compiler)
            if kept and not self.closed:
                self._idle.append(compiler)
            else:  # timed out, cancelled (every waiter left), crashed: its place is free now
                compiler.kill()
                log.info("grammar compiler stopped", kind=what, bytes=len(spec),
                         seconds=round(time.perf_counter() - started, 3))
        log.info("grammar compiled", kind=what, bytes=len(spec), seconds=round(time.perf_counter() - started, 3),
                 error=outcome)

    def close(self) -> int:
        """Stops every compiler (the server stops: the drain is over); how many were compiling."""
        self.closed = True
        for compiler in self._idle:
            compiler.kill()
        self._idle.clear()
        for compiler in self._busy:  # their requests see it (EOFError) and let go of them
            compiler.process.kill()
        return len(self._busy)


class _Compiler:
    """A process that compiles constraints with vLLM's xgrammar backend, as the engine core would. Started
    (seconds: it loads the tokenizer) the first time a large constraint comes, then kept."""

    def __init__(self, vllm_config: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, theirs = context.Pipe()
        self.process = context.Process(target=_serve, args=(theirs, vllm_config), name="choir-grammar", daemon=True)
        self.process.start()
        theirs.close()
        if not self.conn.poll(300) or self.conn.recv() != "ready":
            self.kill()
            raise RuntimeError("the grammar compiler process did not start")

    async def compile(self, kind: Any, spec: str) -> str | None:
        """None once compiled; the compiler's error (the engine's to report) otherwise."""
        self.conn.send((kind, spec))
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not answered.done():
                answered.set_result(None)

        loop.add_reader(self.conn.fileno(), readable)
        try:
            await answered
        finally:
            loop.remove_reader(self.conn.fileno())
        return self.conn.recv()  # EOFError when it died

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()


def _serve(conn: Connection, vllm_config: Any) -> None:
    from setproctitle import setproctitle
    from vllm.tokenizers import cached_tokenizer_from_config
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

    setproctitle(PROCESS_TITLE)
    tokenizer = cached_tokenizer_from_config(model_config=vllm_config.model_config)
    backend = XgrammarBackend(vllm_config, tokenizer=tokenizer, vocab_size=vllm_config.model_config.get_vocab_size())
    conn.send("ready")
    while True:
        try:
            kind, spec = conn.recv()
        except EOFError:
            return
        try:
            backend.compile_grammar(kind, spec)
            conn.send(None)
        except Exception as exc:  # not supported by xgrammar, or invalid: the engine answers for it
            conn.send(f"{type(exc).__name__}: {exc}"[:500])
