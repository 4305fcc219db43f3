"""Properties of the merged stream of an n > 1 request (choir/plugins/aggregation.py's `merge`, through the
real app over ASGI in-process): for any interleaving of the children's outputs, any finish reasons, a
child that fails mid-stream and a client that leaves at any point,

- a stream the disconnect did not cut ends with exactly one `data: [DONE]` (never two, and last);
- without a failure, every choice index finishes exactly once, with its own reason, after all of its
  text, and the usage counts each prompt once and sums every child's tokens;
- with a failure, the stream ends with one error event in OpenAI's shape (the first failure's), or,
  before the first frame, the request fails with that error;
- every engine request that started is finished, failed or aborted, and none is left running, nor
  any task.

The engine is scripted per child: each output waits at a gate that the test opens in the drawn order,
only once that child waits there, so the drawn order is the order the engine produces them in; the
drawn number of loop turns after each opening decides which outputs arrive together (one batch)."""

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from choir.app.asgi import create_app
from choir.core.errors import EngineDead, EngineRejected
from choir.core.settings import Settings
from choir.engine.protocol import NO_OPTIONS
from choir.engine.roles import Engines
from tests.fakes import Call, FakeEngine, Output, SampleOutput, encode

ENDS = ("stop", "length")  # a normal finish
FAILURES = ("rejected", "dead", "bug", "abort")  # raised by the engine, or an output the engine aborted
# What each failure becomes: status (= the error's code) and a piece of its message.
FAILURE_ERRORS = {"rejected": (400, "rejected by the engine"), "dead": (503, "engine is not running"),
                  "bug": (500, "Internal server error"), "abort": (503, "server stopped this request")}
PROMPTS = ["a", "bb", "ccc"]  # completions: prompt k has k + 2 tokens (BOS and one per character)
CHAT_PROMPT = "<user>hi<assistant>"  # what the fake renders the chat below as (one token per character, and BOS)
WAIT = 10.0  # seconds: an example takes milliseconds; this long, and something hangs
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass
class Child:
    pieces: list[str]  # the text of each output (an empty piece is one token with no text)
    end: str  # ENDS or FAILURES

    @property
    def gates(self) -> int:
        """Outputs the engine produces: one per piece, and one more that raises for a raised failure."""
        return len(self.pieces) + (self.end in ("rejected", "dead", "bug"))

    @property
    def tokens(self) -> int:
        return sum(len(token_ids(piece)) for piece in self.pieces)


def token_ids(piece: str) -> list[int]:
    return encode(piece) or [1]


@dataclass
class ScriptedEngine(FakeEngine):
    """A FakeEngine whose children follow `children` (by choice index), each output held at a gate."""

    children: list[Child] = field(default_factory=list)
    prompt_index: dict[str, int] = field(default_factory=dict)  # prompt text → its index
    waiting: dict[int, asyncio.Future] = field(default_factory=dict)  # choice index → its open-me gate
    finished: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    choice_of: dict[str, int] = field(default_factory=dict)  # request id → choice index
    n: int = 1

    def at_gate(self, index: int) -> bool:
        gate = self.waiting.get(index)
        return gate is not None and not gate.done()

    def gone(self, index: int) -> bool:
        return any(self.choice_of.get(rid) == index for rid in [*self.finished, *self.failed, *self.aborted])

    async def generate(self, prompt, params, request_id, options=NO_OPTIONS):
        self.calls.append(Call(prompt, params, request_id, options))
        index = self.prompt_index[prompt.text] * self.n + params.seed  # the request's seed is 0: child i has i
        self.choice_of[request_id] = index
        child = self.children[index]
        self.running.add(request_id)
        try:
            for step in range(child.gates):
                gate = self.waiting[index] = asyncio.get_running_loop().create_future()
                try:
                    await gate
                finally:
                    self.waiting.pop(index, None)
                if step == len(child.pieces):  # a raised failure
                    self.failed.append(request_id)
                    if child.end == "rejected":
                        raise EngineRejected(f"child {index} rejected by the engine")
                    if child.end == "dead":
                        raise EngineDead()
                    raise RuntimeError(f"child {index}: a bug")
                last = step == len(child.pieces) - 1 and child.end not in ("rejected", "dead", "bug")
                piece = child.pieces[step]
                output = SampleOutput(index=0, text=piece, token_ids=token_ids(piece), cumulative_logprob=None,
                                      logprobs=None, finish_reason=child.end if last else None)
                yield Output(request_id=request_id, prompt_token_ids=prompt.token_ids, prompt_logprobs=None,
                             outputs=[output], finished=last)
            self.finished.append(request_id)
        except (asyncio.CancelledError, GeneratorExit):  # as vLLM's generate: leaving early aborts
            self.aborted.append(request_id)
            raise
        finally:
            self.running.discard(request_id)


@dataclass
class Scenario:
    route: str
    n: int
    prompts: int
    children: list[Child]
    schedule: list[int]  # choice indices: whose next output the engine produces, in order
    turns: list[int]  # loop turns after each output
    leave_at: int | None  # the client leaves before this output (len(schedule): after the last)
    include_usage: bool
    continuous_usage: bool
    send_turns: int  # loop turns each write to the client takes

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"n": self.n, "seed": 0, "stream": True, "max_tokens": 30}
        if self.include_usage:
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": self.continuous_usage}
        if self.route == "chat":
            return {**body, "messages": [{"role": "user", "content": "hi"}]}
        return {**body, "prompt": PROMPTS[0] if self.prompts == 1 else PROMPTS[: self.prompts]}

    def prompt_tokens(self, index: int) -> int:
        return 1 + (len(CHAT_PROMPT) if self.route == "chat" else len(PROMPTS[index // self.n]))

    def first_failure(self, before: int) -> Child | None:
        """The failure the engine produces first among the first `before` outputs: the one the client hears."""
        done = [0] * len(self.children)
        for child in self.schedule[:before]:
            plan = self.children[child]
            done[child] += 1
            failing_step = len(plan.pieces) + (plan.end != "abort")
            if plan.end in FAILURES and done[child] == failing_step:
                return plan
        return None


@st.composite
def scenarios(draw) -> Scenario:
    route = draw(st.sampled_from(["chat", "completions"]))
    prompts = 1 if route == "chat" else draw(st.integers(1, 2))
    n = draw(st.integers(1, 4))
    count = prompts * n
    failing = set(draw(st.lists(st.integers(0, count - 1), max_size=2, unique=True)))
    children = []
    for index in range(count):
        end = draw(st.sampled_from(FAILURES if index in failing else ENDS))
        smallest = 0 if end in ("rejected", "dead", "bug") else 1  # a finish comes with an output
        pieces = draw(st.lists(st.text(alphabet="ab é", max_size=3), min_size=smallest, max_size=4))
        children.append(Child(pieces, end))
    schedule = draw(st.permutations([index for index, child in enumerate(children) for _ in range(child.gates)]))
    turns = draw(st.lists(st.integers(0, 3), min_size=len(schedule), max_size=len(schedule)))
    leave_at = draw(st.none() | st.integers(0, len(schedule)))
    include_usage = draw(st.booleans())
    continuous = include_usage and draw(st.booleans())
    send_turns = draw(st.integers(0, 2))
    return Scenario(route, n, prompts, children, list(schedule), turns, leave_at, include_usage, continuous,
                    send_turns)


def http_scope(path: str) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "server": ("t", 80),
            "client": ("c", 1), "headers": [(b"content-type", b"application/json"), (b"x-request-id", b"p")]}


ENGINE = ScriptedEngine()
APP: Any = create_app(Settings(served_model_name="fake-model"))  # called with plain dicts for ASGI messages
APP.state["engine"] = ENGINE  # no lifespan: the engine is there already
APP.state["engines"] = Engines({"generate": ENGINE})


@dataclass
class Outcome:
    status: int
    headers: dict[str, str]
    body: bytes
    complete: bool  # the response's last body message was sent
    leftover_tasks: list[asyncio.Task]
    running_at_end: set[str]  # engine requests still running when the app returned


async def run(scenario: Scenario, engine: ScriptedEngine) -> Outcome:
    sent: list[dict] = []
    leave = asyncio.Event()
    body_sent = False

    async def receive() -> dict:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": json.dumps(scenario.body()).encode(), "more_body": False}
        await leave.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
        for _ in range(scenario.send_turns):  # a client that takes its time: the stream waits in `send`
            await asyncio.sleep(0)

    app = asyncio.create_task(APP(http_scope(PATHS[scenario.route]), receive, send))
    loop = asyncio.get_running_loop()
    for position, index in enumerate(scenario.schedule):
        if position == scenario.leave_at:
            break
        deadline = loop.time() + WAIT
        while not engine.at_gate(index) and not engine.gone(index) and not app.done():
            assert loop.time() < deadline, f"choice {index} never came to produce output {position}"
            await asyncio.sleep(0)
        if engine.at_gate(index):
            engine.waiting.pop(index).set_result(None)
        for _ in range(scenario.turns[position]):
            await asyncio.sleep(0)
    if scenario.leave_at is not None:
        leave.set()
    await asyncio.wait_for(app, WAIT)  # every output is out (or the client left): the app must finish
    running_at_end = set(engine.running)
    for _ in range(5):  # cancelled watchers end on the next turns
        await asyncio.sleep(0)
    leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    for task in leftover:
        task.cancel()
    [start] = [m for m in sent if m["type"] == "http.response.start"]
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    return Outcome(start["status"], {k.decode(): v.decode() for k, v in start["headers"]},
                   b"".join(m.get("body", b"") for m in bodies),
                   bool(bodies) and not bodies[-1].get("more_body", False), leftover, running_at_end)


def check_error(error: Any, expected: Child | None) -> None:
    assert set(error) == {"error"} and set(error["error"]) == {"message", "type", "param", "code"}, error
    assert isinstance(error["error"]["message"], str) and isinstance(error["error"]["type"], str), error
    assert expected is not None, f"an error with no failure: {error}"
    status, words = FAILURE_ERRORS[expected.end]
    assert error["error"]["code"] == status and words in error["error"]["message"], (expected.end, error)


def check_engine(scenario: Scenario, engine: ScriptedEngine, outcome: Outcome) -> None:
    started = [call.request_id for call in engine.calls]
    assert len(started) == len(set(started)) <= len(scenario.children)
    ended = engine.finished + engine.failed + engine.aborted
    assert not outcome.running_at_end, f"still running when the response ended: {outcome.running_at_end}"
    assert sorted(ended) == sorted(started), f"started {started}, finished {engine.finished}, failed " \
                                             f"{engine.failed}, aborted {engine.aborted}"
    assert not outcome.leftover_tasks, outcome.leftover_tasks


def check_stream(scenario: Scenario, outcome: Outcome, failure: Child | None) -> None:
    text = outcome.body.decode()
    assert text.endswith("\n\n") or not outcome.complete
    payloads = [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]
    assert payloads.count("[DONE]") <= 1 and "[DONE]" not in payloads[:-1], payloads[-3:]
    if outcome.complete:
        assert payloads[-1] == "[DONE]", payloads[-3:]
    events = [json.loads(p) for p in payloads if p != "[DONE]"]
    errors = [e for e in events if "error" in e]
    assert len(errors) <= 1 and (not errors or errors[0] is events[-1]), errors
    for error in errors:
        check_error(error, failure)
    usages = [e for e in events if "error" not in e and not e["choices"]]
    chunks = [e for e in events if "error" not in e and e["choices"]]
    count = len(scenario.children)
    finishes: dict[int, str] = {}
    texts = {index: "" for index in range(count)}
    seen: list[int] = []
    for chunk in chunks:
        [choice] = chunk["choices"]
        index = choice["index"]
        assert 0 <= index < count and index not in finishes, f"a chunk for {index} after its finish"
        if scenario.route == "chat":
            if index not in seen:
                assert choice["delta"].get("role") == "assistant", choice  # the role chunk first
            texts[index] += choice["delta"].get("content") or ""
        else:
            texts[index] += choice["text"]
        seen.append(index)
        if choice["finish_reason"] is not None:
            finishes[index] = choice["finish_reason"]
        if scenario.continuous_usage:
            assert chunk["usage"]["prompt_tokens"] == scenario.prompt_tokens(index), chunk
            if choice["finish_reason"] is not None:
                assert chunk["usage"]["completion_tokens"] == scenario.children[index].tokens, chunk
        else:
            assert chunk.get("usage") is None, chunk
    for index, child in enumerate(scenario.children):
        assert "".join(child.pieces).startswith(texts[index]), (index, texts[index], child.pieces)
        if index in finishes:
            assert finishes[index] == child.end and texts[index] == "".join(child.pieces), (index, finishes)
    if not outcome.complete or errors:
        assert not usages or not errors
        return
    # A whole stream without an error: every choice finished once, and the usage is right.
    assert failure is None, "a failure that the stream did not report"
    assert sorted(finishes) == list(range(count)), finishes
    if scenario.include_usage:
        [usage] = usages
        assert usage is events[-1]
        prompt = sum(scenario.prompt_tokens(p * scenario.n) for p in range(scenario.prompts))  # each prompt once
        completion = sum(child.tokens for child in scenario.children)
        assert usage["usage"] == {"prompt_tokens": prompt, "completion_tokens": completion,
                                  "total_tokens": prompt + completion}, usage
    else:
        assert not usages


def check(scenario: Scenario, engine: ScriptedEngine, outcome: Outcome) -> None:
    left = scenario.leave_at is not None
    released = len(scenario.schedule) if scenario.leave_at is None else scenario.leave_at
    failure = scenario.first_failure(released)
    check_engine(scenario, engine, outcome)
    if outcome.status == 200:
        assert outcome.headers["content-type"].startswith("text/event-stream"), outcome.headers
        check_stream(scenario, outcome, failure)
        if not left:
            assert outcome.complete
            if failure is None:  # nothing went wrong: every child ran to its end
                assert not engine.aborted and not engine.failed and len(engine.finished) == len(scenario.children)
        return
    # Not a stream: the request failed before its first frame, or the client left before it.
    assert outcome.headers["content-type"].startswith("application/json"), (outcome.status, outcome.body)
    error = json.loads(outcome.body)
    if outcome.status == 499:
        assert left, "a 499 for a client that stayed"
        return
    check_error(error, failure)
    assert error["error"]["code"] == outcome.status


@given(scenarios())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_merged_stream_ends_once_finishes_every_choice_and_leaves_nothing_running(scenario):
    ENGINE.children, ENGINE.n = scenario.children, scenario.n
    ENGINE.prompt_index = {CHAT_PROMPT: 0, **{p: k for k, p in enumerate(PROMPTS)}}
    for recorded in (ENGINE.calls, ENGINE.finished, ENGINE.failed, ENGINE.aborted):
        recorded.clear()
    ENGINE.running.clear()
    ENGINE.waiting.clear()
    ENGINE.choice_of.clear()
    outcome = asyncio.run(run(scenario, ENGINE))
    check(scenario, ENGINE, outcome)
