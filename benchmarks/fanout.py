"""Fan-out throughput: Choir's n child requests against vLLM's native SamplingParams(n), same engine.

One AsyncLLM (the bundled model, Choir's engine flags) serves both, in this process, with no HTTP:
this isolates what fan-out costs (n engine requests, Choir's merge) from the front end's own cost.
Each round sends the same prompts at the same concurrency, native first, then Choir's, alternating.

    python -m benchmarks.fanout [--n 4 8] [--requests 64] [--concurrency 16] [--max-tokens 32]
"""

import argparse
import asyncio
import gc
import json
import os
import time
from statistics import median

from choir.core.settings import Settings
from choir.engine.sampling import Sampling
from choir.engine.vllm.args import parse_engine_args
from choir.engine.vllm.engine import VllmEngine
from choir.engine.vllm.start import ENGINE_ENVIRONMENT, settle_after_startup
from choir.plugins.aggregation import Aggregator
from choir.plugins.fanout import FanOut, PromptRequest

PROMPT = [1, *range(40, 72)]  # 33 tokens


async def run_native(engine, n: int, requests: int, concurrency: int, max_tokens: int) -> tuple[float, float]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    async def one(i: int) -> int:
        params = SamplingParams(n=n, seed=i, max_tokens=max_tokens, ignore_eos=True,
                                output_kind=RequestOutputKind.FINAL_ONLY, skip_clone=True)
        last = None
        async for output in engine._engine.generate({"prompt_token_ids": PROMPT}, params, f"native-{n}-{i}"):
            last = output
        return sum(len(o.token_ids) for o in last.outputs)

    return await _closed_loop(one, requests, concurrency)


async def run_fanout(engine: VllmEngine, n: int, requests: int, concurrency: int,
                     max_tokens: int) -> tuple[float, float]:
    [prompt] = await engine.render_completion([PROMPT])
    fan_out, aggregator = FanOut(max_n=n), Aggregator(engine)

    async def one(i: int) -> int:
        params = Sampling(seed=i, max_tokens=max_tokens, ignore_eos=True)  # what Choir's serving side builds
        choices = fan_out.choices([PromptRequest(0, prompt, params, f"choir-{n}-{i}")], n)
        outputs = await aggregator.collect(choices)
        return sum(len(o.outputs[0].token_ids) for o in outputs)

    return await _closed_loop(one, requests, concurrency)


async def _closed_loop(one, requests: int, concurrency: int) -> tuple[float, float]:
    """Output tokens per second with `concurrency` requests in flight until `requests` are done, and
    this process's CPU milliseconds per request (the engine core runs in another process)."""
    counter = iter(range(requests))
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        for i in counter:
            tokens += await one(i)

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return tokens / (time.perf_counter() - started), (time.process_time() - cpu) * 1000 / requests


async def main(args: argparse.Namespace) -> None:
    from vllm.platforms import current_platform
    from vllm.v1.engine.async_llm import AsyncLLM

    engine_args = parse_engine_args(Settings(), on_cpu=current_platform.is_cpu())
    llm = AsyncLLM.from_engine_args(engine_args)
    engine = VllmEngine(llm, engine_args, "bench")
    settle_after_startup()  # as Choir's engine start-up does
    results = {}
    try:
        await run_fanout(engine, 2, 8, 4, 4)  # warm-up
        for n in args.n:
            native, choir = [], []
            for _ in range(args.rounds):
                native.append(await run_native(engine, n, args.requests, args.concurrency, args.max_tokens))
                choir.append(await run_fanout(engine, n, args.requests, args.concurrency, args.max_tokens))
            native_tok_s, choir_tok_s = median(t for t, _ in native), median(t for t, _ in choir)
            results[n] = {"native_tok_s": native_tok_s, "fanout_tok_s": choir_tok_s,
                          "ratio": choir_tok_s / native_tok_s,
                          "native_cpu_ms_per_request": median(c for _, c in native),
                          "fanout_cpu_ms_per_request": median(c for _, c in choir), "rounds": args.rounds}
    finally:
        gc.unfreeze()
        llm.shutdown()
        del engine, llm  # AsyncLLM.__del__ fails if it runs at interpreter exit
    print(f"{'n':>3} {'native tok/s':>13} {'fan-out tok/s':>14} {'ratio':>6} {'native CPU ms/req':>18} "
          f"{'fan-out CPU ms/req':>19}")
    for n, r in results.items():
        print(f"{n:>3} {r['native_tok_s']:>13.0f} {r['fanout_tok_s']:>14.0f} {r['ratio']:>6.2f} "
              f"{r['native_cpu_ms_per_request']:>18.2f} {r['fanout_cpu_ms_per_request']:>19.2f}")
    print(json.dumps({"requests": args.requests, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
                      "results": results}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    for key, value in ENGINE_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    asyncio.run(main(parser.parse_args()))
