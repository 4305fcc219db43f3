"""Stream frames: the per-stream template encodes exactly what a whole chunk would, and one engine
step's outputs for several choices come out as one batch (one write)."""

import asyncio

import msgspec
import pytest

from choir.app.serving.streaming import ChunkFrames, data_frame
from choir.core.protocol.chat import ChatChunkChoice, ChatCompletionChunk, Delta
from choir.core.protocol.common import Usage
from choir.core.protocol.completions import CompletionChoice, CompletionChunk
from choir.engine.protocol import NO_OPTIONS
from choir.plugins.aggregation import Aggregator
from choir.plugins.fanout import FanOut, PromptRequest
from tests.fakes import FakeEngine

ENVELOPES = [
    {"id": "cmpl-1", "created": 1, "model": "m"},
    {"id": "cmpl-1", "created": 1, "model": "m", "system_fingerprint": "vllm-0.32-abc"},
    {"id": 'x"choices":[]', "created": 2, "model": '"choices":[],"usage":null'},  # the markers inside strings
]
CHOICES = [
    (CompletionChunk, CompletionChoice(index=0, text="hi \"there\"\n", logprobs=None, finish_reason=None)),
    (CompletionChunk, CompletionChoice(index=3, text="", logprobs=None, finish_reason="length", stop_reason=7)),
    (ChatCompletionChunk, ChatChunkChoice(index=1, delta=Delta(content="é", reasoning_content=None))),
]


@pytest.mark.parametrize("envelope", ENVELOPES)
@pytest.mark.parametrize(("chunk_type", "choice"), CHOICES)
def test_a_frame_is_byte_for_byte_the_whole_chunk_encoded(envelope, chunk_type, choice):
    frames = ChunkFrames(chunk_type, envelope)
    whole = msgspec.json.encode(chunk_type(**envelope, choices=[choice]))
    assert frames.frame(choice) == data_frame(whole)
    usage = Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3)
    assert frames.frame(choice, usage) == data_frame(msgspec.json.encode(chunk_type(**envelope, choices=[choice],
                                                                                   usage=usage)))
    assert frames.usage_frame(usage) == data_frame(msgspec.json.encode(chunk_type(**envelope, choices=[],
                                                                                  usage=usage)))


class LockstepEngine(FakeEngine):
    """Every child produces its next output on the same `step()`, as one engine step does."""

    def __init__(self) -> None:
        super().__init__(script=lambda prompt, params: ["a", "b", "c"], max_model_len=100)
        self.next_step: asyncio.Future | None = None

    async def step(self) -> None:
        self.next_step.set_result(None)  # wakes every child in this loop iteration, before the consumer
        self.next_step = None

    async def generate(self, prompt, params, request_id, options=NO_OPTIONS):
        async for output in super().generate(prompt, params, request_id, options):
            if self.next_step is None:
                self.next_step = asyncio.get_running_loop().create_future()
            await self.next_step
            yield output


async def test_one_engine_step_of_every_choice_is_one_batch():
    from choir.engine.sampling import Sampling

    engine = LockstepEngine()
    [prompt] = await engine.render_completion(["x"])
    params = Sampling(max_tokens=3, stream=True)
    choices = FanOut().choices([PromptRequest(0, prompt, params, "r")], 3)
    batches = Aggregator(engine).merge(choices)
    pending = asyncio.ensure_future(anext(batches))
    sizes = []
    for _ in range(3):
        await asyncio.sleep(0.01)  # every child is waiting for the step
        await engine.step()
        batch = await asyncio.wait_for(pending, 1)
        sizes.append(sorted(choice.index for choice, _ in batch))
        pending = asyncio.ensure_future(anext(batches))
    assert sizes == [[0, 1, 2]] * 3
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(pending, 1)

