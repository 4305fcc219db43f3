"""`EmbeddingEngine` over an AsyncLLM with vLLM's pooling runner (CHOIR_EMBEDDING_MODEL)."""

from contextlib import aclosing
from typing import Any

from core.errors import APIError, stopped_by_server
from plugins.engine.protocol import EngineDead, Prompt
from plugins.engine.vllm_base import VllmBase
from plugins.engine.vllm_errors import reraise


class VllmEmbeddingEngine(VllmBase):
    def __init__(self, engine: Any, engine_args: Any, version: str, model: str | None = None) -> None:
        from vllm import PoolingParams

        super().__init__(engine, engine_args, version, model)
        config = engine.model_config
        self._pooling_params = PoolingParams
        self.embedding_size = int(config.embedding_size)
        dimensions = config.matryoshka_dimensions
        if dimensions:
            self.matryoshka_dimensions: tuple[int, ...] | None = tuple(int(d) for d in dimensions)
        else:
            self.matryoshka_dimensions = () if config.is_matryoshka else None

    async def embed(self, prompt: Prompt, request_id: str, dimensions: int | None = None,
                    normalize: bool | None = None) -> list[float]:
        from vllm.v1.engine.exceptions import EngineDeadError

        # task "embed": one vector per prompt (without it vLLM may pick per-token embeddings).
        try:
            params = self._pooling_params(task="embed", dimensions=dimensions, use_activation=normalize)
        except Exception as exc:
            reraise(exc)
        output = None
        try:
            async with aclosing(self._engine.encode(prompt.engine_input, params, request_id)) as outputs:
                async for output in outputs:  # noqa: B007 (the last one is the answer)
                    pass
        except EngineDeadError as exc:
            raise EngineDead(str(exc)) from exc
        except Exception as exc:
            reraise(exc)
        if output is not None and output.error is not None:  # vLLM's request-level failure
            raise APIError(503 if output.error.retryable else 500, f"The engine could not embed this input: "
                           f"{output.error.message}")
        if output is None or output.outputs.data.numel() == 0:  # an abort's final output is empty
            raise stopped_by_server()
        return output.outputs.data.float().tolist()
