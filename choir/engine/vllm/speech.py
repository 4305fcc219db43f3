"""`Speech` over vLLM's model class for a speech-to-text model (Whisper, ...): its prompts, its window, its
language detection and its post-processing are the model's own, as vLLM's server uses them
(vllm/entrypoints/speech_to_text/base/serving.py); audio is decoded by vLLM's loader (soundfile, else PyAV)."""

import io
import zlib
from collections.abc import Callable
from typing import Any, cast

from choir.engine.protocol import EngineRejected, Prompt
from choir.engine.speech import Audio, Segment, Task
from choir.engine.vllm.base import prompt_of
from choir.engine.vllm.errors import rejection, reraise

TIMESTAMP_SECONDS = 0.02  # Whisper's timestamp tokens: <|0.00|>, <|0.02|>, ...


class VllmSpeech:
    """The speech side of a generation engine whose model transcribes (vLLM's SupportsTranscription)."""

    @classmethod
    def of(cls, engine: Any) -> "VllmSpeech | None":
        from vllm.model_executor.model_loader import get_model_cls
        from vllm.model_executor.models.interfaces import supports_transcription

        if not engine.model_config.is_multimodal_model:  # a text model: no need to ask its class
            return None
        model_cls = get_model_cls(engine.model_config)
        return cls(engine, model_cls) if supports_transcription(model_cls) else None

    def __init__(self, engine: Any, model_cls: Any) -> None:
        import vllm.envs as envs

        self._engine, self._cls, self._model_config = engine, model_cls, engine.model_config
        self._configs = {task: model_cls.get_speech_to_text_config(self._model_config, task)
                         for task in ("transcribe", "translate")}
        config = self._configs["transcribe"]
        self.sample_rate = int(config.sample_rate)
        chunked = config.allow_audio_chunking and config.max_audio_clip_s is not None
        self.window_seconds = float(config.max_audio_clip_s) if config.max_audio_clip_s is not None else None
        self._split = chunked
        self.languages = dict(model_cls.supported_languages)
        self.detects_language = bool(getattr(model_cls, "supports_explicit_language_detection", False))
        self.timestamps = bool(model_cls.supports_segment_timestamp)
        self.no_space_languages = frozenset(model_cls.no_space_languages)
        self._max_decode_bytes = envs.VLLM_MAX_AUDIO_DECODE_BYTES
        tokenizer = engine.renderer.tokenizer
        self._tokenizer = tokenizer
        self._eos = tokenizer.eos_token_id
        begin = tokenizer.convert_tokens_to_ids("<|0.00|>") if self.timestamps else None
        self._timestamp_begin = begin if isinstance(begin, int) and begin != tokenizer.unk_token_id else None

    def decode(self, data: bytes, max_seconds: float) -> Audio:
        from vllm.multimodal.audio import get_audio_duration, split_audio
        from vllm.multimodal.media.audio import load_audio

        try:
            with io.BytesIO(data) as buffer:
                waveform, rate = load_audio(buffer, sr=self.sample_rate, mono=True, max_duration_s=max_seconds,
                                            max_decode_bytes=self._max_decode_bytes)
        except ValueError:
            raise
        except Exception as exc:  # the decoders' own errors: the file's fault
            raise ValueError(f"it cannot be decoded ({type(exc).__name__})") from exc
        seconds = float(get_audio_duration(y=waveform, sr=rate))
        config = self._configs["transcribe"]
        if self._split and self.window_seconds is not None and seconds > self.window_seconds:
            chunks = split_audio(audio_data=waveform, sample_rate=int(rate), max_clip_duration_s=self.window_seconds,
                                 overlap_duration_s=config.overlap_chunk_second,
                                 min_energy_window_size=config.min_energy_split_window_size)
        else:
            chunks = [waveform]
        offsets = [0.0]
        for chunk in chunks[:-1]:
            offsets.append(offsets[-1] + chunk.shape[-1] / self.sample_rate)
        return Audio(chunks=list(chunks), offsets=offsets, seconds=seconds)

    async def prompts(self, audio: Audio, task: Task, language: str | None, prompt: str,
                      timestamps: bool) -> list[Prompt]:
        from vllm.config.speech_to_text import SpeechToTextParams
        from vllm.renderers.inputs.preprocess import parse_enc_dec_prompt, parse_model_prompt

        language = self._cls.validate_language(language)  # ValueError: a language it has no token for
        parsed = []
        for chunk in audio.chunks:
            params = SpeechToTextParams(audio=chunk, stt_config=self._configs[task], model_config=self._model_config,
                                        language=language, task_type=task, request_prompt=prompt)
            generation = self._cls.get_generation_prompt(params)
            if timestamps:  # the decoder starts at <|0.00|>, so the model writes timestamps
                one = parse_enc_dec_prompt(generation)
                decoder = one["decoder_prompt"]
                decoder["prompt"] = decoder["prompt"].replace("<|notimestamps|>", "<|0.00|>")
            else:
                one = parse_model_prompt(self._model_config, generation)
            parsed.append(one)
        try:
            inputs = await self._engine.renderer.render_cmpl_async(parsed)
        except Exception as exc:  # the prompt past the decoder's context, ...
            refused = rejection(exc)
            if refused is None:
                raise
            raise EngineRejected(f"The prompt cannot be rendered for the model: {refused.message}", "prompt") \
                from exc
        return [_prompt(engine_input) for engine_input in inputs]

    async def language_probe(self, audio: Audio) -> tuple[Prompt, list[int]]:
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        probe = self._cls.get_language_detection_prompt(audio.chunks[0], self._configs["transcribe"])
        try:  # the feature extractor runs over the window: in vLLM's renderer threads
            (engine_input,) = await self._engine.renderer.render_cmpl_async(
                [parse_model_prompt(self._model_config, probe)])
        except Exception as exc:
            reraise(exc)
        return _prompt(engine_input), list(self._cls.get_language_token_ids(self._tokenizer))

    def language_of(self, token_ids: list[int]) -> str:
        return cast(str, self._cls.parse_language_detection_output(token_ids, self._tokenizer))

    def segments(self, token_ids: list[int], logprobs: list[float], offset: float) -> list[Segment]:
        """Whisper's reading: the text between two timestamps is a segment; two timestamps in a row end one and
        start the next (the first starts at the prompt's <|0.00|>). Text after the last timestamp, with none
        to end it, ends at it."""
        begin = self._timestamp_begin
        if begin is None:
            return []
        tokens = list(token_ids)
        values = [*logprobs[:len(tokens)], *[0.0] * (len(tokens) - len(logprobs))]  # one per token
        if tokens and tokens[-1] == self._eos:
            tokens, values = tokens[:-1], values[:-1]
        tokens, values = [begin, *tokens], [0.0, *values]
        if len(tokens) >= 2 and tokens[-2] < begin <= tokens[-1]:
            tokens.append(tokens[-1])
            values.append(0.0)
        found: list[Segment] = []
        start, total = 0, 0.0
        for i in range(1, len(tokens)):
            if tokens[i] >= begin and tokens[i - 1] >= begin:
                inner = tokens[start + 1:i - 1]
                text = self._tokenizer.decode(inner)
                encoded = text.encode("utf-8")
                found.append(Segment(
                    start=offset + TIMESTAMP_SECONDS * (tokens[start] - begin),
                    end=offset + TIMESTAMP_SECONDS * (tokens[i - 1] - begin), text=text, tokens=inner,
                    avg_logprob=total / (i - start),
                    compression_ratio=len(encoded) / len(zlib.compress(encoded))))
                start, total = i, 0.0
            else:
                total += values[i]
        return found

    def clean(self, text: str) -> str:
        return cast(str, self._cls.post_process_output(text))

    def stream_cleaner(self) -> Callable[[str, bool], str]:
        processor = self._cls.get_streaming_post_processor_cls()()
        return cast(Callable[[str, bool], str], processor.process_delta)

    def audio_tokens(self, seconds: float) -> int:
        counted = self._cls.get_num_audio_tokens(seconds, self._configs["transcribe"], self._model_config)
        return int(counted or 0)


def _prompt(engine_input: dict[str, Any]) -> Prompt:
    """An encoder-decoder prompt counts its decoder's tokens (the encoder's are the audio's)."""
    if engine_input.get("type") != "enc_dec":
        return prompt_of(engine_input)
    decoder = engine_input["decoder_prompt"]
    return Prompt(token_ids=list(decoder["prompt_token_ids"]), text=decoder.get("prompt"), engine_input=engine_input)
