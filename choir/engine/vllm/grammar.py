"""The grammar gate: no one request's output constraint may hold the engine's grammar compiler for long.

vLLM compiles each request's grammar (a JSON schema, a structural tag, a regex, an EBNF grammar, a choice)
in its engine core, on a pool of (CPUs + 1) // 2 threads: one on a 2-core machine. A 25,000-property
schema holds a thread for minutes (so can a 50-byte pattern: `(a|b){1,8000}`), every constrained request
behind it waits, and a request whose client left keeps compiling: threads cannot be stopped. So before a
constraint reaches the engine, Choir compiles it once itself, with vLLM's own backend and the engine's
settings, in a compiler process of its own, against a time budget:
- over CHOIR_MAX_GRAMMAR_BYTES: a 400 at once;
- not compiled within CHOIR_GRAMMAR_COMPILE_SECONDS: a 400 (now and whenever it comes again), and the
  process is killed (another starts when needed);
- the client leaves while it compiles (every request waiting on it): the process is killed, its place free;
- compiled in time: sent on, and remembered (a digest): the engine's own compile takes about as long.
Small constraints (under PREFLIGHT_FROM_BYTES) have a compiler of their own, so they never queue behind a
large one; until it has started (seconds: it loads the tokenizer), they go straight on. The children of an
`n > 1` request share one compile. A compiler that cannot start leaves the engine to decide, as before.
"""

import asyncio
import hashlib
import multiprocessing
import time
from collections import OrderedDict
from multiprocessing.connection import Connection
from typing import Any

import structlog

from choir.core.errors import EngineRejected, stopped_by_server

log = structlog.get_logger("choir.grammar")

PREFLIGHT_FROM_BYTES = 4096  # the "large" lane from here
REMEMBERED = 4096  # digests of constraints that compiled in time, and of those that did not
RETRY_START_SECONDS = 60  # after a compiler failed to start
PROCESS_TITLE = "choir::GrammarCompiler"


class _Lane:
    """Compiler processes for one size of constraint: places to compile in, the idle processes."""

    def __init__(self, places: int) -> None:
        self.slots = asyncio.Semaphore(places)
        self.idle: list[_Compiler] = []
        self.busy: set[_Compiler] = set()
        self.warming = False


class _Shared:
    """One compile and how many requests wait on it (the children of one `n > 1` request, a resent schema)."""

    def __init__(self, future: "asyncio.Future[None]") -> None:
        self.future, self.waiters = future, 0


class GrammarGate:
    def __init__(self, vllm_config: Any, max_bytes: int, budget_seconds: int, compilers: int) -> None:
        self.vllm_config, self.max_bytes, self.budget = vllm_config, max_bytes, budget_seconds
        self.small, self.large = _Lane(1), _Lane(compilers)
        self._passed: OrderedDict[bytes, None] = OrderedDict()
        self._refused: OrderedDict[bytes, str] = OrderedDict()
        self._pending: dict[bytes, _Shared] = {}
        self._start_after = 0.0
        self._warming: asyncio.Future[None] | None = None
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
        if kind is StructuredOutputOptions.JSON_OBJECT:
            return
        digest = hashlib.sha256(f"{kind.name}:{spec}".encode()).digest()
        if digest in self._passed:
            self._passed.move_to_end(digest)
            return
        if digest in self._refused:
            raise EngineRejected(self._refused[digest])
        if self.closed:
            raise stopped_by_server()
        if time.monotonic() < self._start_after:
            return  # no compiler can start now: the engine decides, as without the gate
        lane = self.small if size < PREFLIGHT_FROM_BYTES else self.large
        if lane is self.small and not lane.idle and not lane.busy:
            self._warm(lane)  # small ones do not wait for a start
            return
        shared = self._pending.get(digest)
        if shared is None:
            shared = self._pending[digest] = _Shared(asyncio.ensure_future(self._compile(lane, kind, spec, digest)))
            shared.future.add_done_callback(lambda _: self._forget(digest, shared))
        shared.waiters += 1
        try:
            await asyncio.shield(shared.future)  # one waiter that leaves must not stop the others' compile
        finally:
            shared.waiters -= 1
            if not shared.waiters and not shared.future.done():  # the last one does
                self._forget(digest, shared)
                shared.future.cancel()

    def _forget(self, digest: bytes, shared: _Shared) -> None:
        if self._pending.get(digest) is shared:
            del self._pending[digest]

    async def _compile(self, lane: _Lane, kind: Any, spec: str, digest: bytes) -> None:
        try:
            await asyncio.wait_for(lane.slots.acquire(), self.budget)
        except TimeoutError:
            raise EngineRejected("Every grammar compiler is busy with other large output constraints; retry "
                                 "(CHOIR_GRAMMAR_COMPILERS).", status=503) from None
        starting: asyncio.Future[_Compiler] | None = None
        try:
            if self.closed:
                raise stopped_by_server()
            if lane.idle:
                compiler = lane.idle.pop()
            else:
                starting = asyncio.ensure_future(asyncio.to_thread(_Compiler, self.vllm_config))
                try:
                    compiler = await asyncio.shield(starting)
                except (OSError, EOFError, RuntimeError) as exc:
                    self._failed_to_start(exc)
                    return
                finally:
                    if starting.done():
                        starting = None
                if self.closed:
                    compiler.kill()
                    raise stopped_by_server()
            await self._run(lane, compiler, kind, spec, digest)
        finally:
            if starting is None:
                lane.slots.release()
            else:  # cancelled while it starts: it keeps the place until it is up, then waits idle
                starting.add_done_callback(lambda done: self._started(lane, done))

    def _started(self, lane: _Lane, starting: "asyncio.Future[_Compiler]") -> None:
        if not starting.cancelled() and starting.exception() is None:
            if self.closed:
                starting.result().kill()
            else:
                lane.idle.append(starting.result())
        lane.slots.release()

    def _warm(self, lane: _Lane) -> None:
        if lane.warming:
            return
        lane.warming = True

        async def warm() -> None:
            try:
                compiler = await asyncio.to_thread(_Compiler, self.vllm_config)
            except (OSError, EOFError, RuntimeError) as exc:
                self._failed_to_start(exc)
            else:
                if self.closed:
                    compiler.kill()
                else:
                    lane.idle.append(compiler)
            finally:
                lane.warming = False

        self._warming = asyncio.ensure_future(warm())

    def _failed_to_start(self, exc: BaseException) -> None:
        log.error("grammar compiler did not start: constraints go to the engine unchecked",
                  error=f"{type(exc).__name__}: {exc}", retry_seconds=RETRY_START_SECONDS)
        self._start_after = time.monotonic() + RETRY_START_SECONDS

    async def _run(self, lane: _Lane, compiler: "_Compiler", kind: Any, spec: str, digest: bytes) -> None:
        what = kind.name.lower().replace("_", " ")
        lane.busy.add(compiler)
        started, kept, error = time.perf_counter(), False, None
        try:
            error = await asyncio.wait_for(compiler.compile(kind, spec), self.budget)
            kept = True
        except TimeoutError:
            message = (f"The output constraint ({what}, {len(spec):,} bytes) did not compile within {self.budget} s "
                       "(CHOIR_GRAMMAR_COMPILE_SECONDS): make it smaller (fewer properties, less nesting, shorter "
                       "alternatives).")
            log.warning("grammar refused", kind=what, bytes=len(spec), seconds=self.budget)
            raise EngineRejected(_remember(self._refused, digest, message)) from None
        except EOFError:  # it died on this constraint (so would the engine's compiler), or the server stops
            if self.closed:
                raise stopped_by_server() from None
            message = f"The output constraint ({what}) cannot be compiled: the grammar compiler crashed on it."
            raise EngineRejected(_remember(self._refused, digest, message)) from None
        except OSError:  # it had died before (idle): this constraint was never tried; the engine decides
            return
        finally:
            lane.busy.discard(compiler)
            if kept and not self.closed:
                lane.idle.append(compiler)
            else:  # timed out, cancelled (every waiter left), crashed: its place is free now
                compiler.kill()
                log.info("grammar compiler stopped", kind=what, bytes=len(spec),
                         seconds=round(time.perf_counter() - started, 3))
        _remember(self._passed, digest, None)
        log.info("grammar compiled", kind=what, bytes=len(spec), seconds=round(time.perf_counter() - started, 3),
                 **({"engine_error": error} if error else {}))

    def close(self) -> int:
        """Stops every compiler (the server stops: the drain is over); how many were compiling."""
        self.closed = True
        busy = 0
        for lane in (self.small, self.large):
            for compiler in lane.idle:
                compiler.kill()
            lane.idle.clear()
            for compiler in lane.busy:  # their requests see it (EOFError) and let go of them
                compiler.process.kill()
            busy += len(lane.busy)
        return busy


def _remember(seen: "OrderedDict[bytes, Any]", digest: bytes, value: Any) -> Any:
    seen[digest] = value
    if len(seen) > REMEMBERED:
        seen.popitem(last=False)
    return value


class _Compiler:
    """A process that compiles constraints with vLLM's xgrammar backend, as the engine core would. Started
    (seconds: it loads the tokenizer) when its lane first needs one, then kept."""

    def __init__(self, vllm_config: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, theirs = context.Pipe()
        self.process = context.Process(target=_serve, args=(theirs, vllm_config), name="choir-grammar", daemon=True)
        self.process.start()
        theirs.close()
        try:
            ready = self.conn.poll(300) and self.conn.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            self.kill()
            raise RuntimeError(f"the grammar compiler process did not start (exit code {self.process.exitcode})")

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
