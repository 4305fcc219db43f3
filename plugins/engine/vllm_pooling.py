"""`PoolingEngine` over an AsyncLLM with vLLM's pooling runner: one role's engine (embed, rerank or classify:
plugins/engine/roles.py). An embedder gives one vector per prompt; a sequence classifier (a cross-encoder is
one with a single label) gives one probability per label, per prompt or per query and document pair."""

import asyncio
from contextlib import aclosing
from typing import Any

from core.errors import APIError, stopped_by_server
from core.settings import RoleModel, SettingsError
from plugins.engine.protocol import EngineDead, Prompt
from plugins.engine.roles import ROLES
from plugins.engine.vllm_base import SMALL_PROMPT, VllmBase, prompt_of
from plugins.engine.vllm_errors import reraise


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
        id2label = getattr(config.hf_config, "id2label", None) or {}
        self.labels = tuple(id2label.get(i) for i in range(int(getattr(config.hf_config, "num_labels", 0) or 0)))
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
        return cls(engine, engine_args, version, model)

    async def render_pair(self, first: str, second: str) -> Prompt:
        """A query and a document as one prompt, as vLLM's cross-encoder scoring tokenizes them."""
        tokenizer = self._engine.renderer.tokenizer

        def encode() -> list[int]:
            if self._pair_separated:
                return list(tokenizer(text=first, text_pair=second)["input_ids"])
            return list(tokenizer(text=first + second)["input_ids"])

        try:
            ids = encode() if len(first) + len(second) <= SMALL_PROMPT else await asyncio.to_thread(encode)
        except Exception as exc:
            reraise(exc)
        return prompt_of({"prompt_token_ids": ids})

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

        try:
            pooling = self._pooling_params(**params)
        except Exception as exc:
            reraise(exc)
        output = None
        try:
            async with aclosing(self._engine.encode(prompt.engine_input, pooling, request_id)) as outputs:
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
    task = ROLES[role].task
    assert task is not None, f"{role} is not a pooling role"
    return task
