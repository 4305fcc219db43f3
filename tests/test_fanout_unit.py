"""Fan-out and aggregation below HTTP: the child requests n becomes (ids, seeds, params), the limits,
and how their outputs come back together (order, the first failure, closing a merged stream)."""

import asyncio

import pytest

from choir.core.errors import APIError, EngineRejected
from choir.core.protocol.common import INT64_MAX
from choir.engine.protocol import NO_OPTIONS, GenerateOptions
from choir.engine.sampling import Sampling
from choir.plugins.aggregation import Aggregator, cached_tokens, prompt_tokens, usage
from choir.plugins.fanout import FanOut, PromptRequest
from tests.fakes import FakeEngine


def params(seed=None, max_tokens=3, delta=False):
    return Sampling(max_tokens=max_tokens, seed=seed, stream=delta, temperature=0.5)


async def prompts(engine, *texts):
    return await engine.render_completion(list(texts))


async def test_n_children_get_vllms_ids_and_seeds():
    engine = FakeEngine()
    [prompt] = await prompts(engine, "x")
    options = GenerateOptions(adapter="tuned")
    choices = FanOut().choices([PromptRequest(0, prompt, params(seed=7), "cmpl-r", options)], 3)
    assert [(c.index, c.request_id, c.params.seed) for c in choices] == [(0, "0_cmpl-r", 7), (1, "1_cmpl-r", 8),
                                                                         (2, "2_cmpl-r", 9)]
    assert all(c.options is options and c.params.temperature == 0.5 for c in choices)
    [single] = FanOut().choices([PromptRequest(0, prompt, params(seed=7), "cmpl-r")], 1)
    assert (single.request_id, single.params.seed, single.options) == ("cmpl-r", 7, NO_OPTIONS)  # n=1: untouched
    unseeded = FanOut().choices([PromptRequest(0, prompt, params(), "r")], 2)
    assert [c.params.seed for c in unseeded] == [None, None]


async def test_several_prompts_index_prompt_major():
    engine = FakeEngine()
    a, b = await prompts(engine, "a", "bb")
    choices = FanOut().choices([PromptRequest(0, a, params(), "r-0"), PromptRequest(1, b, params(), "r-1")], 2)
    assert [(c.index, c.prompt_index, c.request_id) for c in choices] == [
        (0, 0, "0_r-0"), (1, 0, "1_r-0"), (2, 1, "0_r-1"), (3, 1, "1_r-1")]
    assert prompt_tokens(choices) == len(a.token_ids) + len(b.token_ids)  # each prompt once
    assert usage(choices, 10).total_tokens == prompt_tokens(choices) + 10
    assert cached_tokens(choices, [2, 1, 3, 3]) == 1 + 3 and cached_tokens(choices, [None, 1, 1, 1]) is None


@pytest.mark.parametrize("call, param", [
    (lambda f: f.check(129, None), "n"),
    (lambda f: f.check(2, INT64_MAX), "seed"),
    (lambda f: f.check_prompts(1025, 1), "prompt"),
    (lambda f: f.check_prompts(2, 600, "input"), "n"),
    (lambda f: f.check_prompts(1025, 1, "input"), "input"),
])
def test_limits(call, param):
    with pytest.raises(APIError) as raised:
        call(FanOut())
    assert raised.value.param == param


async def test_collect_returns_the_final_outputs_in_choice_order():
    engine = FakeEngine(script=lambda prompt, p: [f"seed {p.seed}"], delay=0.001)
    [prompt] = await prompts(engine, "x")
    choices = FanOut().choices([PromptRequest(0, prompt, params(seed=1), "r")], 3)
    outputs = await Aggregator(engine).collect(choices)
    assert [o.outputs[0].text for o in outputs] == ["seed 1", "seed 2", "seed 3"]


async def test_the_first_failure_ends_every_sibling():
    engine = FakeEngine(script=lambda prompt, p: ["t"] * 50, delay=0.01, max_model_len=200)
    original = engine.generate

    async def generate(prompt, p, request_id, options=NO_OPTIONS):
        if request_id.startswith("1_"):
            await asyncio.sleep(0.02)
            raise EngineRejected("child 1 refused")
        async for output in original(prompt, p, request_id, options):
            yield output

    engine.generate = generate
    [prompt] = await prompts(engine, "x")
    choices = FanOut().choices([PromptRequest(0, prompt, params(max_tokens=50), "r")], 3)
    with pytest.raises(EngineRejected, match="child 1"):
        await Aggregator(engine).collect(choices)
    assert sorted(engine.aborted) == ["0_r", "2_r"] and not engine.running


async def test_closing_a_merged_stream_aborts_every_child():
    engine = FakeEngine(script=lambda prompt, p: ["t"] * 50, delay=0.01, max_model_len=200)
    [prompt] = await prompts(engine, "x")
    choices = FanOut().choices([PromptRequest(0, prompt, params(max_tokens=50, delta=True), "r")], 3)
    batches = Aggregator(engine).merge(choices)
    seen = set()
    while len(seen) < 3:
        seen |= {choice.index for choice, _ in await anext(batches)}
    await batches.aclose()
    assert sorted(engine.aborted) == ["0_r", "1_r", "2_r"] and not engine.running


async def test_pinned_placement_puts_a_requests_children_on_one_rank_taking_ranks_in_turn():
    engine = FakeEngine()
    [a, b] = await prompts(engine, "x", "y")
    options = GenerateOptions(adapter="tuned")
    fan_out = FanOut(placement="pinned")
    both = [PromptRequest(0, a, params(), "r1", options), PromptRequest(1, b, params(), "r2", options)]
    first = fan_out.choices(both, 3, ranks=2)
    assert len({c.options.data_parallel_rank for c in first}) == 1  # every child of the request: one rank
    assert all(c.options.adapter == "tuned" for c in first)  # the rest of the options kept
    second = fan_out.choices([PromptRequest(0, a, params(), "r3")], 2, ranks=2)
    assert {c.options.data_parallel_rank for c in second} == {1 - first[0].options.data_parallel_rank}
    # Spread, one rank, or n = 1: vLLM's balancer places every request.
    spread = FanOut(placement="spread").choices([PromptRequest(0, a, params(), "r")], 3, 2)
    assert {c.options.data_parallel_rank for c in spread} == {None}
    assert {c.options.data_parallel_rank for c in fan_out.choices([PromptRequest(0, a, params(), "r")], 3, 1)} \
        == {None}
    assert fan_out.choices([PromptRequest(0, a, params(), "r")], 1, 2)[0].options is NO_OPTIONS
