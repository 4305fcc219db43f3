"""A prompt as the engine takes it: what every engine role renders and generates or pools from."""

from typing import Any

import msgspec


class Prompt(msgspec.Struct, frozen=True):
    """A prompt rendered and tokenized for the engine."""

    token_ids: list[int]
    text: str | None
    engine_input: Any  # opaque to Choir: handed back to `Engine.generate`
    # A prompt with images: how to render it again with its images' data in it, for an engine that lost them
    # from its cache (the engine's business: vllm_engine.py)
    rerender: Any = None
