"""VllmEmbeddingEngine below HTTP, over a stub of vLLM's AsyncLLM that answers as vLLM's output processor
does: a vector, an aborted request's empty final output, or a request-level error."""

from types import SimpleNamespace

import pytest
import torch
from vllm.outputs import RequestError

from core.errors import APIError
from plugins.engine.protocol import Prompt
from plugins.engine.vllm_embedding import VllmEmbeddingEngine

PROMPT = Prompt(token_ids=[1, 2], text="ab", engine_input={"prompt_token_ids": [1, 2]})


class StubPoolingLLM:
    def __init__(self, data: torch.Tensor, error: RequestError | None = None) -> None:
        self.errored = False
        self.model_config = SimpleNamespace(max_model_len=64, embedding_size=4, matryoshka_dimensions=None,
                                            is_matryoshka=False)
        self.renderer = SimpleNamespace(tokenizer=SimpleNamespace(max_token_id=99))
        self.data, self.error = data, error

    async def encode(self, engine_input, params, request_id):
        yield SimpleNamespace(outputs=SimpleNamespace(data=self.data), error=self.error, finished=True)


def engine_over(stub: StubPoolingLLM) -> VllmEmbeddingEngine:
    return VllmEmbeddingEngine(stub, SimpleNamespace(served_model_name="embed", model="/models/embed"), "test")


async def test_the_vector():
    engine = engine_over(StubPoolingLLM(torch.tensor([0.5, 0.5, 0.5, 0.5], dtype=torch.float16)))
    assert await engine.embed(PROMPT, "e1") == [0.5, 0.5, 0.5, 0.5]


async def test_an_aborted_request_is_a_503_never_an_empty_vector():
    """vLLM ends a request it aborted (the shutdown drain) with an empty tensor."""
    with pytest.raises(APIError) as raised:
        await engine_over(StubPoolingLLM(torch.empty(0))).embed(PROMPT, "e1")
    assert raised.value.status == 503 and "shutting down" in raised.value.message


@pytest.mark.parametrize("retryable, status", [(True, 503), (False, 500)])
async def test_a_request_level_error_is_said(retryable, status):
    error = RequestError(code="multimodal_cache_miss", message="Multi-modal processor cache miss.", retryable=retryable)
    with pytest.raises(APIError) as raised:
        await engine_over(StubPoolingLLM(torch.empty(0), error)).embed(PROMPT, "e1")
    assert raised.value.status == status and "cache miss" in raised.value.message
