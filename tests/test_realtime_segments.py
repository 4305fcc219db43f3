"""How a realtime utterance is cut into engine requests (choir/engine/vllm/realtime.py's `_Segments`): each request
takes segments while the next one and its transcript's tokens still fit the model's context (vLLM 0.32's engine
dies past it), the one that does not opens the next request, and a segment that cannot fit alone is refused.
The model's segments and vLLM's renderer are stood in for; the real engine: tests/integration/test_realtime.py."""

import asyncio
from typing import Any

import pytest

from choir.engine.protocol import EngineRejected
from choir.engine.vllm.realtime import _Segments


class Model:
    """The few attributes `_Segments` reads of VllmRealtime: each segment's prompt is its length in tokens."""

    def __init__(self, max_model_len: int, max_tokens: int = 64) -> None:
        self.max_model_len, self.max_tokens = max_model_len, max_tokens

    async def render(self, prompt: int) -> dict[str, Any]:
        return {"type": "token", "prompt_token_ids": list(range(prompt))}


async def cut(model: Model, sizes: list[int]) -> tuple[list[list[int]], _Segments]:
    async def buffered():
        for size in sizes:
            yield size

    stream, requests = _Segments(model, buffered()), []
    while not stream.ended:
        requests.append([len(item.prompt["prompt_token_ids"]) async for item in stream.next_request()])
    return requests, stream


def test_segments_fill_a_request_up_to_the_context_and_the_next_one_opens_the_next():
    # 83 + 64 = 147 tokens a segment with its transcript: two fit in a context of 300 (one kept for the closing input)
    requests, stream = asyncio.run(cut(Model(300), [83, 83, 83, 83, 40]))
    assert requests == [[83, 83], [83, 83], [40]]
    assert stream.requests == 3 and stream.prompt_tokens == 4 * 83 + 40


def test_the_bundled_models_context_takes_thirteen_five_second_segments():
    requests, stream = asyncio.run(cut(Model(2048), [83] * 20))
    assert [len(request) for request in requests] == [13, 7]
    assert stream.prompt_tokens == 20 * 83


def test_no_audio_is_one_request_with_no_segment():
    requests, stream = asyncio.run(cut(Model(300), []))
    assert requests == [[]] and stream.prompt_tokens == 0


def test_a_segment_that_cannot_fit_alone_is_refused():
    with pytest.raises(EngineRejected, match=r"A segment of audio takes 147 tokens .* \(100 tokens, --max-model-len\)"):
        asyncio.run(cut(Model(100), [83]))
