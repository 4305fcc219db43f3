"""`EmbeddingEngine` over an AsyncLLM with vLLM's pooling runner (CHOIR_EMBEDDING_MODEL)."""

from contextlib import aclosing
from typing import Any

from plugins.engine.protocol import EngineDead, Prompt
from plugins.engine.vllm_base import VllmBase
from plugins.engine.vllm_errors import reraise


class VllmEmbeddingEngine(VllmBase):
    def __init__(self, engine: Any, engine_args: Any, version: str) -> None:
        from vllm import PoolingParams

        super().__init__(engine, engine_args, version)
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
        vector = None
        try:
            async with aclosing(self._engine.encode(prompt.engine_input, params, request_id)) as outputs:
                async for output in outputs:
                    vector = output.outputs.data
        except EngineDeadError as exc:
            raise EngineDead(str(exc)) from exc
        except Exception as exc:
            reraise(exc)
        assert vector is not None, "the pooling engine finished without an output"
        return vector.float().tolist()
