"""VllmPoolingEngine below HTTP, over a stub of vLLM's AsyncLLM that answers as vLLM's output processor
does: a vector, an aborted request's empty final output, or a request-level error."""

from types import SimpleNamespace

import pytest
import torch
from vllm.outputs import RequestError

from choir.core.errors import APIError
from choir.core.settings import RoleModel, SettingsError
from choir.engine.protocol import Prompt
from choir.engine.vllm.pooling import VllmPoolingEngine

PROMPT = Prompt(token_ids=[1, 2], text="ab", engine_input={"prompt_token_ids": [1, 2]})


class StubPoolingLLM:
    def __init__(self, data: torch.Tensor, error: RequestError | None = None) -> None:
        self.errored = False
        self.model_config = SimpleNamespace(max_model_len=64, embedding_size=4, matryoshka_dimensions=None,
                                            is_matryoshka=False, use_sep_token=True,
                                            hf_config=LabelConfig(2, {0: "no", 1: "yes"}),
                                            is_multimodal_model=False, multimodal_config=None)
        self.renderer = SimpleNamespace(tokenizer=PairTokenizer())
        self.data, self.error = data, error

    async def encode(self, engine_input, params, request_id):
        self.params = params
        yield SimpleNamespace(outputs=SimpleNamespace(data=self.data), error=self.error, finished=True)

    async def get_supported_tasks(self):
        return ("classify", "token_classify")


class LabelConfig(SimpleNamespace):
    def __init__(self, num_labels: int, id2label: dict[int, str]) -> None:
        super().__init__(num_labels=num_labels, id2label=id2label)

    def get_text_config(self) -> "LabelConfig":
        return self


class PairTokenizer:
    """A character tokenizer whose pair encoding puts a 0 between the texts (as a tokenizer's separator);
    with `segments`, a BERT-style one that also gives token_type_ids (0 for the query, 1 for the document)."""

    max_token_id = 99

    def __init__(self, segments: bool = False) -> None:
        self.segments = segments

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % 90 + 3 for c in text]

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return 1 if pair else 0

    def __call__(self, text: str, text_pair: str | None = None, add_special_tokens: bool = True,
                 return_offsets_mapping: bool = False, truncation: str | None = None,
                 max_length: int | None = None) -> dict[str, list]:
        ids = self.encode(text)
        encoding: dict[str, list] = {"input_ids": ids}
        if return_offsets_mapping:
            encoding["offset_mapping"] = [(i, i + 1) for i in range(len(text))]
        if text_pair is not None:
            second = self.encode(text_pair)
            if truncation == "only_second" and max_length is not None:
                second = second[:max_length - len(ids) - 1]
            encoding["input_ids"] = [*ids, 0, *second]
            if self.segments:
                encoding["token_type_ids"] = [0] * (len(ids) + 1) + [1] * len(second)
        return encoding


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


async def test_a_bert_style_pair_keeps_where_the_document_starts_and_a_document_may_be_cut():
    """vLLM's cross-encoder path hands the model its segment ids as `compressed_token_type_ids`: without them
    a BERT reranker reads the document as query and scores otherwise than vLLM's server."""
    stub = StubPoolingLLM(torch.tensor([0.5]))
    stub.renderer.tokenizer = PairTokenizer(segments=True)
    engine = engine_over(stub, "rerank")
    pair = await engine.render_pair("ab", "cdef")
    assert pair.token_ids == [*PairTokenizer().encode("ab"), 0, *PairTokenizer().encode("cdef")]
    assert await engine.classify(pair, "r1") == [0.5]
    assert stub.params.extra_kwargs == {"compressed_token_type_ids": 3}  # "ab" and the separator
    cut = await engine.render_pair("ab", "cdef", max_second_tokens=2)
    assert cut.token_ids == [*PairTokenizer().encode("ab"), 0, *PairTokenizer().encode("cd")]
    await engine.classify(PROMPT, "c1")  # a plain prompt: no segments
    assert stub.params.extra_kwargs is None


async def test_a_reranker_with_several_labels_is_refused_in_one_line():
    stub = StubPoolingLLM(torch.tensor([0.5]))  # two labels
    with pytest.raises(SettingsError, match="CHOIR_RERANK_MODEL=.*2 labels.*CHOIR_CLASSIFY_MODEL"):
        await VllmPoolingEngine.create(stub, SimpleNamespace(served_model_name="m", model="m"), "test",
                                       RoleModel("rerank", "/models/classify"))


async def test_a_model_without_the_roles_task_is_refused_in_one_line():
    stub = StubPoolingLLM(torch.tensor([0.5]))
    with pytest.raises(SettingsError, match="CHOIR_EMBEDDING_MODEL=.*cannot serve embed.*--convert embed") as raised:
        await VllmPoolingEngine.create(stub, SimpleNamespace(served_model_name="m", model="m"), "test",
                                       RoleModel("embed", "/models/embed"))
    assert "\n" not in str(raised.value)
    stub.model_config.hf_config = LabelConfig(1, {0: "relevance"})
    created = await VllmPoolingEngine.create(stub, SimpleNamespace(served_model_name="m", model="m"), "test",
                                             RoleModel("rerank", "/models/embed"))
    assert created.task == "classify" and created.labels == ("relevance",)


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
