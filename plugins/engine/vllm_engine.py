"""`Engine` over vLLM's `AsyncLLM`. Imported only inside the lifespan: vLLM pulls in torch (seconds)."""

import gc
import os
import time
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

import structlog

from app.settings import Settings, SettingsError
from plugins.engine.protocol import (
    CHAT_RENDER,
    COMPLETION_RENDER,
    NO_OPTIONS,
    ChatTemplateOptions,
    EngineDead,
    GenerateOptions,
    Prompt,
    RenderOptions,
)

log = structlog.get_logger("choir.engine")

# Engine processes talk over ZMQ: keep that on loopback. CPU KV cache in GiB: vLLM-CPU's
# default reservation fails on small machines.
ENGINE_ENVIRONMENT = {"VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1"}
# vLLM-CPU 0.32 kills its engine ("CPU Generator does not use offset") when a seeded
# request gets a partial prefill; fan-out seeds every child, so chunked prefill stays off.
CPU_ENGINE_ARGS = ("--no-enable-chunked-prefill",)


def parse_engine_args(settings: Settings, *, on_cpu: bool) -> Any:
    """CHOIR_ENGINE_ARGS through vLLM's own parser, as `vllm serve` would parse them."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Parser(FlexibleArgumentParser):
        def error(self, message: str):  # argparse would print usage and exit
            raise SettingsError(f"CHOIR_ENGINE_ARGS: {message}")

    parser = AsyncEngineArgs.add_cli_args(Parser(prog="CHOIR_ENGINE_ARGS"))
    # parse_args, not parse_known_args: vLLM's own preprocessing (dotted flags such as
    # --structured-outputs-config.disable_any_whitespace, --config files) lives there. An unknown flag
    # reaches error() above.
    namespace = parser.parse_args(settings.engine_argv(CPU_ENGINE_ARGS if on_cpu else ()))
    return AsyncEngineArgs.from_cli_args(namespace)


class VllmEngine:
    def __init__(self, engine: Any, engine_args: Any, version: str, tool_parser: str | None = None,
                 reasoning_parser: str | None = None) -> None:
        from vllm.renderers.params import ChatParams, TokenizeParams

        self._engine = engine
        self._chat_params = ChatParams
        config = engine.model_config
        self.served_model_names = tuple(config.served_model_name if isinstance(config.served_model_name, list)
                                        else [config.served_model_name])
        self.model_root = str(engine_args.model)
        self.max_model_len = int(config.max_model_len)
        self.version = version
        self.default_sampling_params = dict(config.get_diff_sampling_param())
        self.tool_parser = tool_parser
        self.parsers = None
        if tool_parser or reasoning_parser:  # unknown names stop start-up here, with the known ones
            from app.serving.parsers import ParserSet

            self.parsers = ParserSet.load(engine.renderer.tokenizer, reasoning_parser, tool_parser)
        self.priority_scheduling = engine.vllm_config.scheduler_config.policy == "priority"
        self.vocab_size = engine.renderer.tokenizer.max_token_id + 1
        self.started_at = int(time.time())
        self._tokenize_params = TokenizeParams
        self._tokenize_cache: dict[RenderOptions, Any] = {}

    @property
    def is_alive(self) -> bool:
        return not self._engine.errored

    def _tokenize(self, options: RenderOptions) -> Any:
        """vLLM's TokenizeParams for these options, built once per distinct options. Choir checks
        lengths itself (clear messages, the right `param`), so vLLM's check is off."""
        params = self._tokenize_cache.get(options)
        if params is None:
            params = self._tokenize_cache[options] = self._tokenize_params(
                max_total_tokens=None, add_special_tokens=options.add_special_tokens,
                needs_detokenization=options.detokenize, truncate_prompt_tokens=options.truncate_prompt_tokens,
                truncation_side=options.truncation_side)
        return params

    async def render_completion(self, prompts: list[str] | list[list[int]],
                                options: RenderOptions = COMPLETION_RENDER) -> list[Prompt]:
        dict_prompts = [{"prompt": p} if isinstance(p, str) else {"prompt_token_ids": p} for p in prompts]
        tok_params, renderer = self._tokenize(options), self._engine.renderer
        extras = {"cache_salt": options.cache_salt} if options.cache_salt is not None else None
        if sum(len(p) for p in prompts) <= SMALL_PROMPT:
            inputs = renderer.render_cmpl(dict_prompts, tok_params, prompt_extras=extras)
        else:
            inputs = await renderer.render_cmpl_async(dict_prompts, tok_params, prompt_extras=extras)
        return [_prompt(engine_input) for engine_input in inputs]

    async def render_chat(self, messages: list[dict[str, Any]], template: ChatTemplateOptions,
                          options: RenderOptions = CHAT_RENDER) -> Prompt:
        kwargs = {**template.kwargs, "add_generation_prompt": template.add_generation_prompt,
                  "continue_final_message": template.continue_final_message}
        params, renderer = self._chat_params(chat_template_kwargs=kwargs), self._engine.renderer
        tok_params = self._tokenize(options)
        extras = {"cache_salt": options.cache_salt} if options.cache_salt is not None else None
        if sum(len(str(m.get("content") or "")) for m in messages) <= SMALL_PROMPT:
            _, inputs = renderer.render_chat([messages], params, tok_params, prompt_extras=extras)
        else:
            _, inputs = await renderer.render_chat_async([messages], params, tok_params, prompt_extras=extras)
        return _prompt(inputs[0])

    async def generate(self, prompt: Prompt, params: Any, request_id: str,
                       options: GenerateOptions = NO_OPTIONS) -> AsyncIterator[Any]:
        from vllm.v1.engine.exceptions import EngineDeadError

        extra = {} if options is NO_OPTIONS else {
            "priority": options.priority, "session_id": options.session_id,
            "reasoning_ended": options.reasoning_ended, "reasoning_parser_kwargs": options.reasoning_parser_kwargs}
        try:
            # aclosing: when our caller closes us, vLLM's generator must see it now (and abort).
            async with aclosing(self._engine.generate(prompt.engine_input, params, request_id, **extra)) as outputs:
                async for output in outputs:
                    yield output
        except EngineDeadError as exc:
            raise EngineDead(str(exc)) from exc

    def token_strings(self, token_ids: list[int]) -> list[str]:
        tokenizer = self._engine.renderer.tokenizer
        return [tokenizer.decode([token_id]) for token_id in token_ids]

    def detokenize(self, token_ids: list[int]) -> str:
        return self._engine.renderer.tokenizer.decode(token_ids)

    def token_pieces(self, token_ids: list[int]) -> list[str]:
        """The vocabulary's own pieces (`Ġword`), as vLLM's /tokenize returns them."""
        return self._engine.renderer.tokenizer.convert_ids_to_tokens(token_ids)

    async def abort(self, request_id: str) -> None:
        await self._engine.abort(request_id)

    async def abort_all(self) -> int:
        request_ids = list(self._engine.output_processor.external_req_ids)
        if request_ids:
            await self._engine.abort(request_ids)
        return len(request_ids)

    def num_unfinished_requests(self) -> int:
        return self._engine.get_num_unfinished_requests()


# vLLM renders and tokenizes in a thread pool. For a short prompt the hand-over costs more than the
# work: py-spy (--gil) put 15 % of the front end's samples in ThreadPoolExecutor.submit at 160 req/s.
# Short prompts (characters, or token ids) are rendered on the event loop; long ones still go to the
# pool, so the loop is never held for long.
SMALL_PROMPT = 8192


def _prompt(engine_input: dict[str, Any]) -> Prompt:
    return Prompt(token_ids=list(engine_input["prompt_token_ids"]), text=engine_input.get("prompt"),
                  engine_input=engine_input)


def settle_after_startup() -> None:
    """What vLLM's own processes do once started. Freeze what start-up allocated (vLLM, torch,
    tokenizers: hundreds of thousands of objects), so that no full collection walks it again; and
    cache vLLM's environment variables, which it otherwise reads from os.environ on every access
    (several per request: SamplingParams checks some)."""
    from vllm.envs import enable_envs_cache

    enable_envs_cache()
    gc.collect()
    gc.freeze()


@asynccontextmanager
async def start_vllm_engine(settings: Settings) -> AsyncIterator[VllmEngine]:
    # vLLM reads its settings from the environment: Choir's defaults, under what .env says.
    from_settings = {key: value for key, value in settings.environ.items() if key.startswith("VLLM_")}
    for key, value in {**ENGINE_ENVIRONMENT, **from_settings}.items():
        os.environ.setdefault(key, value)
    import vllm
    from vllm.platforms import current_platform
    from vllm.v1.engine.async_llm import AsyncLLM

    engine_args = parse_engine_args(settings, on_cpu=current_platform.is_cpu())
    if settings.reasoning_parser or settings.tool_parser:  # a name vLLM lacks stops start-up before the engine
        from app.serving.parsers import parser_classes

        parser_classes(settings.reasoning_parser, settings.tool_parser)
    started = time.perf_counter()
    engine = AsyncLLM.from_engine_args(engine_args)
    log.info("engine started", model=settings.model, seconds=round(time.perf_counter() - started, 1))
    settle_after_startup()
    try:
        # A parser name vLLM does not know raises SettingsError here: the engine is shut down below,
        # then EngineConfig.lifespan reports the setting in one line.
        yield VllmEngine(engine, engine_args, vllm.__version__, tool_parser=settings.tool_parser,
                         reasoning_parser=settings.reasoning_parser)
    finally:
        gc.unfreeze()  # collectable again, at shutdown at the latest
        engine.shutdown()
        log.info("engine stopped")
