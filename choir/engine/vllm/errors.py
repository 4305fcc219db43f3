"""vLLM's errors at the engine seam: what vLLM raises for a request it refuses becomes Choir's
`EngineRejected` (a 4xx with vLLM's message, and its `param` where vLLM names one); anything else
stays what it is, and the HTTP side answers it with a generic 500. So a bug of Choir's own (a
TypeError in its code) never looks like the client's fault: like vLLM's own server, only vLLM's
ValueErrors are refusals, and each `reraise` guards a call into vLLM alone."""

from typing import NoReturn

from choir.core.errors import EngineRejected

_PARAMETER_SUFFIX = " (parameter="
# What vLLM raises for a value it cannot take (a seed past 64 bits is an OverflowError in torch).
_REFUSALS = (ValueError, OverflowError)


def rejection(exc: BaseException) -> EngineRejected | None:
    """The EngineRejected that `exc`, raised by vLLM for a request, means; None when it is not one."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if "GracefulHTTPError" in names:  # admission control: the queue is full (503), ...
        return EngineRejected(str(getattr(exc, "message", exc)), status=int(getattr(exc, "http_status", 503)))
    if "VLLMClientError" in names:  # its request validation
        return EngineRejected(_message(exc), getattr(exc, "parameter", None))
    if "EngineGenerateError" in names and isinstance(exc.__cause__, _REFUSALS):
        return EngineRejected(_message(exc.__cause__))  # input processing refused it, wrapped by AsyncLLM
    if isinstance(exc, _REFUSALS):  # rendering, SamplingParams' own checks
        return EngineRejected(_message(exc), getattr(exc, "parameter", None))
    return None


def reraise(exc: Exception) -> NoReturn:
    """In `except Exception as exc:` around a call into vLLM: its refusal as EngineRejected, anything
    else as it was. (A handler, not a context manager: the calls that succeed pay nothing.)"""
    rejected = rejection(exc)
    if rejected is None:
        raise exc
    raise rejected from exc


def _message(exc: BaseException) -> str:
    text = str(exc).split(_PARAMETER_SUFFIX)[0].strip() or type(exc).__name__
    return text if text.endswith((".", "!", "?")) else text + "."
