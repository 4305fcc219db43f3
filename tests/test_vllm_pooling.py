"""VllmPoolingEngine below HTTP, over a stub of vLLM's AsyncLLM that answers as vLLM's output processor
does: a vector, an aborted request's empty final output, or a request-level error."""

from types import SimpleNamespace

import pytest
import torch
from vllm.outputs import RequestError

from core.errors import APIError
from core.settings import RoleModel, SettingsError
from plugins.engine.protocol import Prompt
from plugins.engine.vllm_pooling import VllmPoolingEngine

PROMPT = Prompt(token_ids=[1, 2], text="ab", engine_input={"prompt_token_ids": [1, 2]})


class StubPoolingLLM:
    def __init__(self, data: torch.Tensor, error: RequestError | None = None) -> None:
        self.errored = False
        self.model_config = SimpleNamespace(max_model_len=64, embedding_size=4, matryoshka_dimensions=None,
                                            is_matryoshka=False, use_sep_token=True,
                                            hf_config=SimpleNamespace(num_labels=2, id2label={0: "no", 1: "yes"}))
        self.renderer = SimpleNamespace(tokenizer=PairTokenizer())
        self.data, self.error = data, error

    async def encode(self, engine_input, params, request_id):
        self.params = params
        yield SimpleNamespace(outputs=SimpleNamespace(data=self.data), error=self.error, finished=True)

    async def get_supported_tasks(self):
        return ("classify", "token_classify")


class PairTokenizer:
    """A character tokenizer whose pair encoding puts a 0 between the texts (as a tokenizer's separator)."""

    max_token_id = 99

    def __call__(self, text: str, text_pair: str | None = None) -> dict[str, list[int]]:
        ids = [ord(c) % 90 + 3 for c in text]
        return {"input_ids": ids if text_pair is None else [*ids, 0, *self(text_pair)["input_ids"]]}


def engine_over(stub: StubPoolingLLM, role: str = "embed") -> VllmPoolingEngine:
    return VllmPoolingEngine(stub, SimpleNamespace(served_model_name="embed", model="/models/embed"), "test",
                             RoleModel(role, "/models/embed"))


async def test_a_classifier_gives_one_value_per_label_and_names_them():
    stub = StubPoolingLLM(torch.tensor([0.25, 0.75]))
    engine = engine_over(stub, "classify")
    assert engine.labels == ("no", "yes")
    assert await engine.classify(PROMPT, "c1") == [0.25, 0.75]
    assert stub.params.task == "classify"


async def test_a_pair_is_the_tokenizers_own_pair_encoding_or_the_texts_joined():
    stub = StubPoolingLLM(torch.tensor([0.5]))
    engine = engine_over(stub, "rerank")
    assert (await engine.render_pair("ab", "c")).token_ids == [*PairTokenizer()("ab")["input_ids"], 0, 12]
    stub.model_config.use_sep_token = False  # an LLM turned reranker: no separator
    assert (await engine_over(stub, "rerank").render_pair("ab", "c")).token_ids == PairTokenizer()("abc")["input_ids"]


async def test_a_model_without_the_roles_task_is_refused_in_one_line():
    stub = StubPoolingLLM(torch.tensor([0.5]))
    with pytest.raises(SettingsError, match="CHOIR_EMBEDDING_MODEL=.*cannot serve embed.*--convert embed") as raised:
        await VllmPoolingEngine.create(stub, SimpleNamespace(served_model_name="m", model="m"), "test",
                                       RoleModel("embed", "/models/embed"))
    assert "\n" not in str(raised.value)
    created = await VllmPoolingEngine.create(stub, SimpleNamespace(served_model_name="m", model="m"), "test",
                                             RoleModel("rerank", "/models/embed"))
    assert created.task == "classify"


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
