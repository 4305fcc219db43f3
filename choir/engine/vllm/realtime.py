"""`Realtime` over vLLM's model class for a streaming speech model (Qwen3-ASR realtime, Voxtral realtime): the
model buffers the audio into segments and makes each segment's prompt itself, each is rendered by vLLM's
renderer and sent into one resumable engine request (vLLM's streaming input), and what the model wrote is fed
back to the model's buffering as context, as vLLM's own server does (vllm/entrypoints/speech_to_text/realtime/)."""

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from choir.engine.protocol import EngineDead, EngineRejected
from choir.engine.speech import Transcribed
from choir.engine.vllm.errors import reraise

PCM16_SCALE = 32768.0


class VllmRealtime:
    """The realtime side of a generation engine whose model streams speech to text."""

    @classmethod
    def of(cls, engine: Any) -> "VllmRealtime | None":
        from vllm.model_executor.model_loader import get_model_cls
        from vllm.model_executor.models.interfaces import supports_realtime

        if not engine.model_config.is_multimodal_model:
            return None
        model_cls = get_model_cls(engine.model_config)
        return cls(engine, model_cls) if supports_realtime(model_cls) else None

    def __init__(self, engine: Any, model_cls: Any) -> None:
        self._engine, self._cls, self._model_config = engine, model_cls, engine.model_config
        config = model_cls.get_speech_to_text_config(self._model_config, "transcribe")
        self.sample_rate = int(config.sample_rate)
        self.max_tokens = int(model_cls.realtime_max_tokens)  # each segment's transcript, as vLLM asks
        self.max_model_len = int(self._model_config.max_model_len)

    def samples(self, pcm16: bytes) -> Any:
        import numpy as np

        return np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / PCM16_SCALE

    async def transcribe(self, audio: AsyncIterator[Any], request_id: str) -> AsyncGenerator[Transcribed, None]:
        """vLLM's realtime requests grow with each segment and nothing stops one at the model's context: past it,
        vLLM 0.32's engine dies (its own server's too). Here a request ends while the next segment (and its
        transcript's tokens) still fits, and the segment opens a new request (`{request_id}-1`, ...)."""
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        from vllm.v1.engine.exceptions import EngineDeadError

        written: asyncio.Queue[list[int]] = asyncio.Queue()  # the model's own text, as context for what follows
        buffered = self._cls.buffer_realtime_audio(audio, written, self._model_config)
        params = SamplingParams.from_optional(temperature=0.0, max_tokens=self.max_tokens,
                                              output_kind=RequestOutputKind.DELTA, skip_clone=True)
        stream = _Segments(self, buffered)
        try:
            async with aclosing(buffered):
                while not stream.ended:
                    requested = request_id if not stream.requests else f"{request_id}-{stream.requests}"
                    async with aclosing(self._engine.generate(stream.next_request(), params, requested)) as outputs:
                        async for output in outputs:
                            if not output.outputs:
                                continue
                            completion = output.outputs[0]
                            token_ids = list(completion.token_ids)
                            written.put_nowait(token_ids)
                            yield Transcribed(completion.text, len(token_ids), stream.prompt_tokens)
        except EngineDeadError as exc:
            raise EngineDead(str(exc)) from exc
        except EngineRejected:
            raise
        except Exception as exc:
            reraise(exc)

    async def render(self, prompt: Any) -> Any:
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        (engine_input,) = await self._engine.renderer.render_cmpl_async([parse_model_prompt(self._model_config,
                                                                                              prompt)])
        return engine_input


class _Segments:
    """The model's segments, rendered, cut into engine requests that each fit the model's context."""

    def __init__(self, realtime: VllmRealtime, buffered: AsyncIterator[Any]) -> None:
        self._realtime, self._buffered = realtime, buffered
        self._room = realtime.max_model_len - 1  # the engine's closing input (no segment) takes a token
        self._carried: Any = None  # a segment the last request had no room for
        self.requests = 0
        self.prompt_tokens = 0  # every segment's, so far
        self.ended = False

    async def next_request(self) -> AsyncGenerator[Any, None]:
        from vllm.engine.protocol import StreamingInput

        self.requests += 1
        used = 0
        while True:
            engine_input, self._carried = self._carried, None
            if engine_input is None:
                prompt = await anext(self._buffered, None)
                if prompt is None:
                    self.ended = True
                    return
                engine_input = await self._realtime.render(prompt)
            size = len(engine_input["prompt_token_ids"]) + self._realtime.max_tokens  # its prompt, its transcript
            if size > self._room:
                raise EngineRejected(f"A segment of audio takes {size} tokens with its transcript, more than the "
                                     f"model's context ({self._room + 1} tokens, --max-model-len).", "audio")
            if used + size > self._room:
                self._carried = engine_input
                return
            used += size
            self.prompt_tokens += size - self._realtime.max_tokens
            yield StreamingInput(prompt=engine_input)
