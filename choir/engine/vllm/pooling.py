"""`PoolingEngine` over an AsyncLLM with vLLM's pooling runner: one role's engine (embed, rerank or classify:
choir/engine/roles.py). An embedder gives one vector per prompt; a sequence classifier (a cross-encoder is
one with a single label) gives one probability per label, per prompt or per query and document pair."""

import asyncio
from contextlib import aclosing
from typing import Any, NamedTuple

from choir.core.errors import APIError, stopped_by_server
from choir.core.settings import RoleModel, SettingsError, pooling_role
from choir.engine.protocol import EngineDead, Prompt
from choir.engine.vllm.base import SMALL_PROMPT, VllmBase
from choir.engine.vllm.errors import reraise


class _Pair(NamedTuple):
    """A query and document pair's engine input: the tokens, and where the document's segment starts."""

    prompt: dict[str, Any]
    token_types: int | None


class VllmPoolingEngine(VllmBase):
    def __init__(self, engine: Any, engine_args: Any, version: str, model: RoleModel) -> None:
        from vllm import PoolingParams

        super().__init__(engine, engine_args, version, model.model)
        self.role, self.task = model.role, _task(model.role)
        self._pooling_params = PoolingParams
        config = engine.model_config
        self.embedding_size = int(config.embedding_size)
        dimensions = config.matryoshka_dimensions
        if dimensions:
            self.matryoshka_dimensions: tuple[int, ...] | None = tuple(int(d) for d in dimensions)
        else:
            self.matryoshka_dimensions = () if config.is_matryoshka else None
        # As vLLM sizes the classifier head: the model's num_labels, else its text model's (a VLM's).
        hf_config = config.hf_config
        labels = hf_config.num_labels if hf_config.num_labels != 2 else hf_config.get_text_config().num_labels
        id2label = getattr(hf_config, "id2label", None) or {}
        self.labels = tuple(id2label.get(i) for i in range(int(labels))) if self.task == "classify" else ()
        # A cross-encoder's pair: the tokenizer's own pair encoding (its separator), or the two texts joined
        # for an LLM turned reranker (vLLM's `use_sep_token`, in the model's config).
        self._pair_separated = bool(config.use_sep_token)

    @classmethod
    async def create(cls, engine: Any, engine_args: Any, version: str, model: RoleModel) -> "VllmPoolingEngine":
        """Refuses, in one line, a model that cannot run the role's task (a generator named as a reranker)."""
        tasks = await engine.get_supported_tasks()
        task = _task(model.role)
        if task not in tasks:
            variable, _, flags = model.variables
            raise SettingsError(f"{variable}={model.model!r} cannot serve {model.role}: vLLM's pooling runner "
                                f"gives it {', '.join(tasks) or 'no task'}, not {task}. Name a model with that head "
                                f"(or convert it: {flags}='--convert {task}').")
        served = cls(engine, engine_args, version, model)
        if model.role == "rerank" and len(served.labels) != 1:
            raise SettingsError(f"{model.variables[0]}={model.model!r} has {len(served.labels)} labels: a reranker "
                                "(a cross-encoder) gives one score per pair, so it has one label. Serve a classifier "
                                "with CHOIR_CLASSIFY_MODEL.")
        return served

    async def render_pair(self, first: str, second: str, max_second_tokens: int | None = None) -> Prompt:
        """A query and a document as one prompt, as vLLM's cross-encoder scoring tokenizes them: the document
        cut to `max_second_tokens` first; the segment ids a BERT-style model reads (token_type_ids) kept."""
        from vllm.entrypoints.pooling.scoring.utils import (
            compress_token_type_ids,
            get_num_special_tokens_for_pair,
            truncate_text_to_tokens,
        )

        tokenizer = self._engine.renderer.tokenizer

        def encode() -> _Pair:
            cut = second if max_second_tokens is None else truncate_text_to_tokens(second, tokenizer,
                                                                                   max_second_tokens)
            if not self._pair_separated:
                encoding = tokenizer(text=first + cut)
            elif max_second_tokens is None:
                encoding = tokenizer(text=first, text_pair=cut)
            else:
                limit = len(tokenizer.encode(first, add_special_tokens=False)) + max_second_tokens + \
                    get_num_special_tokens_for_pair(tokenizer)
                encoding = tokenizer(text=first, text_pair=cut, truncation="only_second", max_length=limit)
            types = encoding.get("token_type_ids")
            return _Pair({"prompt_token_ids": list(encoding["input_ids"])},
                         None if types is None else compress_token_type_ids(list(types)))

        try:
            pair = encode() if len(first) + len(second) <= SMALL_PROMPT else await asyncio.to_thread(encode)
        except Exception as exc:
            reraise(exc)
        return Prompt(token_ids=pair.prompt["prompt_token_ids"], text=None, engine_input=pair)

    async def embed(self, prompt: Prompt, request_id: str, dimensions: int | None = None,
                    normalize: bool | None = None) -> list[float]:
        # task "embed": one vector per prompt (without it vLLM may pick per-token embeddings).
        return await self._pool(prompt, request_id, task="embed", dimensions=dimensions, use_activation=normalize)

    async def classify(self, prompt: Prompt, request_id: str, activation: bool | None = None) -> list[float]:
        """One value per label: probabilities (softmax over several labels, a sigmoid over one), or the
        logits with `activation` false."""
        return await self._pool(prompt, request_id, task="classify", use_activation=activation)

    async def _pool(self, prompt: Prompt, request_id: str, **params: Any) -> list[float]:
        from vllm.v1.engine.exceptions import EngineDeadError

        engine_input = prompt.engine_input
        if isinstance(engine_input, _Pair):
            if engine_input.token_types is not None:  # where the document's segment starts (vLLM's own key)
                params["extra_kwargs"] = {"compressed_token_type_ids": engine_input.token_types}
            engine_input = engine_input.prompt
        try:
            pooling = self._pooling_params(**params)
        except Exception as exc:
            reraise(exc)
        output = None
        try:
            async with aclosing(self._engine.encode(engine_input, pooling, request_id)) as outputs:
                async for output in outputs:  # noqa: B007 (the last one is the answer)
                    pass
        except EngineDeadError as exc:
            raise EngineDead(str(exc)) from exc
        except Exception as exc:
            reraise(exc)
        if output is not None and output.error is not None:  # vLLM's request-level failure
            raise APIError(503 if output.error.retryable else 500, f"The engine could not pool this input: "
                           f"{output.error.message}")
        if output is None or output.outputs.data.numel() == 0:  # an abort's final output is empty
            raise stopped_by_server()
        return output.outputs.data.float().tolist()


def _task(role: str) -> str:
    return pooling_role(role).task
