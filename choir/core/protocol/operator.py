"""The operator routes' one body (POST /collective_rpc), in vLLM's shape."""

from typing import Annotated

import msgspec


class CollectiveRpcRequest(msgspec.Struct, kw_only=True):
    """A method every engine worker runs. Arguments are strings only, as on vLLM's server: the method decodes
    them itself."""

    method: Annotated[str, msgspec.Meta(min_length=1)]
    args: list[str] = []
    kwargs: dict[str, str] = {}
    timeout: Annotated[float, msgspec.Meta(gt=0)] | None = None  # seconds; None: the engine's own
