"""The limit: the same scenarios sent to AsyncLLM in this process, no HTTP. `frontend_cpu_ms_per_request`
is this process's CPU per request (AsyncLLM's own output processing and detokenization)."""

import asyncio
import gc
import os
import time

from benchmarks.load import MESSAGES, PROMPT, Scenario, summary
from choir.core.settings import Settings
from choir.engine.protocol import ChatTemplateOptions
from choir.engine.vllm.args import parse_engine_args
from choir.engine.vllm.engine import VllmEngine
from choir.engine.vllm.start import ENGINE_ENVIRONMENT, settle_after_startup


async def _scenario(engine: VllmEngine, scenario: Scenario) -> dict:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    if scenario.endpoint == "chat":
        prompt = await engine.render_chat(MESSAGES, ChatTemplateOptions())
    else:
        [prompt] = await engine.render_completion([PROMPT])
    kind = RequestOutputKind.DELTA if scenario.stream else RequestOutputKind.FINAL_ONLY
    latencies, ttfts, tokens = [], [], 0
    counter = iter(range(scenario.requests))

    async def worker() -> None:
        nonlocal tokens
        for seed in counter:
            params = SamplingParams(n=scenario.n, seed=seed, max_tokens=scenario.max_tokens, ignore_eos=True,
                                    output_kind=kind, skip_clone=True)
            started, first = time.perf_counter(), None
            # AsyncLLM itself (vLLM's own n, its own SamplingParams): Choir's seam takes one sample per request.
            async for output in engine._engine.generate(prompt.engine_input, params,
                                                        f"direct-{scenario.label}-{seed}"):
                if first is None:
                    first = time.perf_counter() - started
                tokens += sum(len(o.token_ids) for o in output.outputs)
            latencies.append(time.perf_counter() - started)
            if scenario.stream:
                ttfts.append(first)

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(scenario.concurrency)))
    elapsed = time.perf_counter() - started
    result = summary(scenario, elapsed, latencies, ttfts, tokens, 0)
    result["frontend_cpu_ms_per_request"] = (time.process_time() - cpu) * 1000 / scenario.requests
    return result


async def measure_all(plan: list[Scenario]) -> dict[str, dict]:
    for key, value in ENGINE_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    from vllm.platforms import current_platform
    from vllm.v1.engine.async_llm import AsyncLLM

    engine_args = parse_engine_args(Settings(), on_cpu=current_platform.is_cpu())
    llm = AsyncLLM.from_engine_args(engine_args)
    engine = VllmEngine(llm, engine_args, "bench")
    settle_after_startup()  # as Choir and vLLM's server do: the floor gets every help the engine offers
    try:
        await _scenario(engine, Scenario("completions", 1, True, 4, 4, 8))  # warm-up
        return {scenario.label: await _scenario(engine, scenario) for scenario in plan}
    finally:
        gc.unfreeze()
        llm.shutdown()
        del engine, llm
