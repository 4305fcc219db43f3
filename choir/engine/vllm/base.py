"""What Choir's two vLLM engines share (generation, vllm_engine.py; embeddings, vllm_embedding.py):
the AsyncLLM they wrap, how prompts and conversations are tokenized (/tokenize serves both kinds), and the
engine's liveness and request counts."""

import os
from functools import partial
from typing import Any

from choir.core.protocol.chat import AUDIO_PARTS
from choir.core.settings import SettingsError
from choir.engine.protocol import (
    CHAT_RENDER,
    COMPLETION_RENDER,
    ChatTemplateOptions,
    EngineRejected,
    ImagesRejected,
    Prompt,
    RenderOptions,
)
from choir.engine.vllm.errors import rejection, reraise
from choir.engine.vllm.operator import VllmOperator
from choir.engine.vllm.text_tokens import direct_encoder, plain_text_tokens, text_prompt

# Where vLLM loads and processes images: an error raised there is the images' fault
MEDIA_CODE = os.path.join("vllm", "multimodal", "")

# vLLM renders and tokenizes in a thread pool. For a short prompt the hand-over costs more than the
# work: py-spy (--gil) put 15 % of the front end's samples in ThreadPoolExecutor.submit at 160 req/s.
# Short prompts (characters, or token ids) are rendered on the event loop; long ones still go to the
# pool, so the loop is never held for long.
SMALL_PROMPT = 8192
TOKENIZE_CACHE_SIZE = 256  # distinct RenderOptions kept (each a few hundred bytes)


class VllmBase(VllmOperator):
    def __init__(self, engine: Any, engine_args: Any, version: str, model: str | None = None) -> None:
        """`model`: the model as configured (vLLM's args hold a local path in its place under HF_HUB_OFFLINE)."""
        from vllm.renderers.params import ChatParams, TokenizeParams

        self._engine = engine
        config = engine.model_config
        # The engine args keep every alias; vLLM's model config keeps the first (as vLLM's server reads them).
        names = engine_args.served_model_name or config.served_model_name
        self.served_model_names = tuple(names if isinstance(names, list) else [names])
        self.model_root = model or str(engine_args.model)
        self.max_model_len = int(config.max_model_len)
        self.version = version
        tokenizer = engine.renderer.tokenizer
        if tokenizer is None:  # --skip-tokenizer-init
            raise SettingsError("--skip-tokenizer-init is not supported: Choir renders chat templates, tokenizes "
                                "prompts and detokenizes outputs itself with the model's tokenizer.")
        self.vocab_size = tokenizer.max_token_id + 1
        self.max_images = _max_items(engine, "image")
        self.max_audios = _max_items(engine, "audio")
        self._tokenize_params, self._chat_params = TokenizeParams, ChatParams
        self._tokenize_cache: dict[RenderOptions, Any] = {}
        self._encode = direct_encoder(tokenizer)

    def render_chats_with(self, template: str | None, content_format: str) -> None:
        """The server's own chat rendering (vLLM's --chat-template, a file's path or the template itself;
        --chat-template-content-format). --default-chat-template-kwargs are the serving side's: the parsers see
        them too."""
        if template is None and content_format == "auto":
            return
        from vllm.renderers.chat_utils import load_chat_template
        from vllm.renderers.params import ChatParams

        try:
            loaded = load_chat_template(template) if template is not None else None
        except Exception as exc:  # vLLM's own types: ValueError, VLLMValidationError
            raise SettingsError(f"CHOIR_CHAT_TEMPLATE (--chat-template): {exc}") from None

        self._chat_params = partial(ChatParams, chat_template=loaded, chat_template_content_format=content_format)

    @property
    def is_alive(self) -> bool:
        return not self._engine.errored

    @property
    def tokenizer(self) -> Any:
        """vLLM's tokenizer of the model: the serving side builds its parsers with it."""
        return self._engine.renderer.tokenizer

    def _tokenize(self, options: RenderOptions) -> Any:
        """vLLM's TokenizeParams for these options, built once per distinct options. Choir checks
        lengths itself (clear messages, the right `param`), so vLLM's check is off."""
        params = self._tokenize_cache.get(options)
        if params is None:
            if len(self._tokenize_cache) >= TOKENIZE_CACHE_SIZE:  # clients choose truncation lengths: bounded
                self._tokenize_cache.clear()
            params = self._tokenize_cache[options] = self._tokenize_params(
                max_total_tokens=None, add_special_tokens=options.add_special_tokens,
                needs_detokenization=options.detokenize, truncate_prompt_tokens=options.truncate_prompt_tokens,
                truncation_side=options.truncation_side)
        return params

    async def render_completion(self, prompts: list[str] | list[list[int]],
                                options: RenderOptions = COMPLETION_RENDER) -> list[Prompt]:
        tok_params, renderer, extras = self._tokenize(options), self._engine.renderer, prompt_extras(options)
        short = sum(len(p) for p in prompts) <= SMALL_PROMPT
        # a short text prompt is tokenized here where that gives the renderer's very ids (text_tokens.py)
        encode = self._encode if short and plain_text_tokens(tok_params) else None
        try:
            dict_prompts = [text_prompt(p, encode, tok_params.add_special_tokens) if isinstance(p, str)
                            else {"prompt_token_ids": p} for p in prompts]
            if short:
                inputs = renderer.render_cmpl(dict_prompts, tok_params, prompt_extras=extras)
            else:
                inputs = await renderer.render_cmpl_async(dict_prompts, tok_params, prompt_extras=extras)
        except Exception as exc:
            reraise(exc)
        return [prompt_of(engine_input) for engine_input in inputs]

    async def render_chat(self, messages: list[dict[str, Any]], template: ChatTemplateOptions,
                          options: RenderOptions = CHAT_RENDER) -> Prompt:
        """Rendered by vLLM's renderer, images included: it loads them (in its thread pool) and its multimodal
        processor puts each image's tokens in the prompt. The prompt handed to the engine carries the processed
        image, so the children of an `n > 1` request share it."""
        kwargs = {**template.kwargs, "add_generation_prompt": template.add_generation_prompt,
                  "continue_final_message": template.continue_final_message}
        if options.add_special_tokens:
            # The template renders text, then the tokenizer adds its special tokens (bos), as vLLM's server
            # does; a template that tokenizes by itself never adds them.
            kwargs["tokenize"] = False
        media = any(isinstance(m.get("content"), list) and any(p.get("type") != "text" for p in m["content"])
                    for m in messages)
        params, renderer = self._chat_params(chat_template_kwargs=kwargs), self._engine.renderer
        tok_params, extras = self._tokenize(options), prompt_extras(options)
        if media:  # as vLLM's server: the model's default media_io_kwargs under the request's
            defaults = self._engine.model_config.multimodal_config
            params = self._chat_params(chat_template_kwargs=kwargs, media_io_kwargs=template.media_io_kwargs)
            params = params.with_defaults(default_media_io_kwargs=defaults.media_io_kwargs if defaults else None,
                                          default_mm_processor_kwargs=template.mm_processor_kwargs)
            if template.mm_processor_kwargs:
                extras = {**(extras or {}), "mm_processor_kwargs": template.mm_processor_kwargs}
        try:
            if not media and sum(len(str(m.get("content") or "")) for m in messages) <= SMALL_PROMPT:
                _, inputs = renderer.render_chat([messages], params, tok_params, prompt_extras=extras)
            else:  # images are loaded and processed off the event loop
                _, inputs = await renderer.render_chat_async([messages], params, tok_params, prompt_extras=extras,
                                                             skip_mm_cache=options.skip_mm_cache)
        except Exception as exc:
            refused = rejection(exc)
            in_media = media and _raised_in_media_code(exc)
            if refused is None and in_media:  # a decoder's own error (libsndfile's on a damaged FLAC, ...)
                refused = EngineRejected(f"{type(exc).__name__}: {exc}")
            if refused is None:
                raise
            if in_media:
                kind = "audio" if any(part.get("type") in AUDIO_PARTS for m in messages
                                      if isinstance(m.get("content"), list) for part in m["content"]) else "images"
                raise ImagesRejected(f"The {kind} cannot be processed for the model: {refused.message}",
                                     "messages") from exc
            raise EngineRejected(f"The messages cannot be rendered with the model's chat template: "
                                 f"{refused.message}", "messages") from exc
        if not media:
            return prompt_of(inputs[0])

        async def rerender() -> Any:
            """The engine input again, its images' data in it whatever vLLM's processor cache says."""
            _, fresh = await renderer.render_chat_async([messages], params, tok_params, prompt_extras=extras,
                                                        skip_mm_cache=True)
            return fresh[0]

        engine_input = inputs[0]
        return Prompt(token_ids=list(engine_input["prompt_token_ids"]), text=engine_input.get("prompt"),
                      engine_input=engine_input, rerender=rerender)

    def token_strings(self, token_ids: list[int]) -> list[str]:
        tokenizer = self._engine.renderer.tokenizer
        return [tokenizer.decode([token_id]) for token_id in token_ids]

    def detokenize(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._engine.renderer.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def token_pieces(self, token_ids: list[int]) -> list[str]:
        """The vocabulary's own pieces (`Ġword`), as vLLM's /tokenize returns them."""
        return self._engine.renderer.tokenizer.convert_ids_to_tokens(token_ids)

    async def abort_all(self) -> int:
        request_ids = list(self._engine.output_processor.external_req_ids)
        if request_ids:
            await self._engine.abort(request_ids)
        return len(request_ids)

    def num_unfinished_requests(self) -> int:
        return self._engine.get_num_unfinished_requests()


def _max_items(engine: Any, modality: str) -> int:
    """How many images (audios) one prompt may hold: 0 for a model without such input, else its
    --limit-mm-per-prompt."""
    config = engine.model_config
    if not config.is_multimodal_model or config.multimodal_config is None:
        return 0
    try:  # --limit-mm-per-prompt, within what the model itself takes (vLLM's own bound)
        allowed = engine.renderer.get_mm_processor().info.allowed_mm_limits
    except Exception:  # a processor that cannot say: vLLM's limit alone decides
        return int(config.multimodal_config.get_limit_per_prompt(modality))
    return int(allowed.get(modality, 0))


def _raised_in_media_code(exc: BaseException) -> bool:
    """Whether vLLM's image loading or multimodal processing refused the prompt (a truncated JPEG, ...), not its
    chat template or its kwargs: some frame of the error's chain is in `vllm/multimodal/`."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frame = current.__traceback__
        while frame is not None:
            if MEDIA_CODE in frame.tb_frame.f_code.co_filename:
                return True
            frame = frame.tb_next
        current = current.__cause__ or current.__context__
    return False


def prompt_extras(options: RenderOptions) -> dict[str, Any] | None:
    """What vLLM's renderers add to each prompt beyond its tokens."""
    return {"cache_salt": options.cache_salt} if options.cache_salt is not None else None


def prompt_of(engine_input: dict[str, Any]) -> Prompt:
    return Prompt(token_ids=list(engine_input["prompt_token_ids"]), text=engine_input.get("prompt"),
                  engine_input=engine_input)
