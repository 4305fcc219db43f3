"""POST /tokenize and /detokenize: the engine's own tokenizer and chat template, nothing generated; the
`model` picks the engine (an embedding model's too, as vLLM's server tokenizes for pooling models).

As vLLM's server: `prompt` is tokenized with special tokens (bos), `messages` are rendered with the
chat template first (which writes its own). Unlike vLLM's, an id outside the vocabulary is a 400
naming it, not silently dropped from the text.
"""

from typing import Any

import msgspec

from choir.app.serving.models import tokenizing_engine
from choir.core.errors import bad_request
from choir.core.protocol import without_none
from choir.core.protocol.tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from choir.engine.protocol import ChatTemplateOptions, RenderOptions
from choir.plugins.media import render_images
from choir.plugins.pipeline import Pipeline


async def tokenize(pipeline: Pipeline, request: TokenizeRequest) -> TokenizeResponse:
    engine = tokenizing_engine(pipeline, request.model)
    if request.prompt is not None and request.messages is not None:
        raise bad_request("Send `prompt` (text) or `messages` (a conversation) to tokenize, not both.", "messages")
    if request.prompt is None and request.messages is None:
        raise bad_request("Send `prompt` (text) or `messages` (a conversation) to tokenize.", "prompt")
    if request.prompt is not None:
        options = RenderOptions(add_special_tokens=_or(request.add_special_tokens, True))
        [prompt] = await engine.render_completion([request.prompt], options)
    elif request.messages is not None:
        if request.add_generation_prompt and request.continue_final_message:
            raise bad_request("add_generation_prompt and continue_final_message cannot both be true: a reply "
                              "either starts or continues the last message.", "continue_final_message")
        # the server's defaults under the request's own, as for a chat request
        kwargs: dict[str, Any] = {**pipeline.defaults.chat_template_kwargs, **(request.chat_template_kwargs or {})}
        if request.tools:
            kwargs.setdefault("tools", msgspec.to_builtins(request.tools))
        template = ChatTemplateOptions(add_generation_prompt=request.add_generation_prompt,
                                       continue_final_message=request.continue_final_message, kwargs=kwargs,
                                       media_io_kwargs=request.media_io_kwargs,
                                       mm_processor_kwargs=request.mm_processor_kwargs)
        pipeline.compat.check_roles([message.role for message in request.messages])
        messages = without_none(msgspec.to_builtins(request.messages))
        # an image counts the tokens the model's processor gives it, as in a chat request
        names = await pipeline.media.prepare(messages, engine.max_images, request.mm_processor_kwargs,
                                             request.media_io_kwargs)
        names += await pipeline.audio.prepare(messages, engine.max_audios)
        prompt = await render_images(engine, messages, template,
                                     RenderOptions(add_special_tokens=_or(request.add_special_tokens, False),
                                                   skip_mm_cache=True), names)
    tokens = list(prompt.token_ids)
    return TokenizeResponse(count=len(tokens), max_model_len=engine.max_model_len, tokens=tokens,
                            token_strs=engine.token_pieces(tokens) if request.return_token_strs else None)


def detokenize(pipeline: Pipeline, request: DetokenizeRequest) -> DetokenizeResponse:
    engine = tokenizing_engine(pipeline, request.model)
    for index, token in enumerate(request.tokens):
        if token >= engine.vocab_size:
            raise bad_request(f"Token id {token} is out of vocabulary: ids go from 0 to {engine.vocab_size - 1}.",
                              f"tokens[{index}]")
    return DetokenizeResponse(prompt=engine.detokenize(request.tokens))


def _or(value: bool | None, default: bool) -> bool:
    return default if value is None else value
