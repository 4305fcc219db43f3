"""A client that leaves stops its request: the engine requests behind it are aborted at once.

vLLM's server does this with `with_cancellation`; here one asyncio task per request watches the
ASGI `receive` channel and cancels the task that serves the request when `http.disconnect` comes.
Cancelling `engine.generate` aborts the request in vLLM, so every choice of a fanned-out request
stops with it. Streams use the same watch (choir/app/routes/event_stream.py).
"""

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from litestar.types import Receive

from choir.core.errors import APIError
from choir.plugins.metrics import REQUEST_DISCONNECTS

T = TypeVar("T")


class ClientDisconnected(APIError):
    """The client closed the connection before the answer was ready; nobody reads this error."""

    def __init__(self) -> None:
        super().__init__(499, "The client closed the connection before the response was ready.")


class DisconnectWatch:
    """Cancels `task` when the client disconnects, until stopped."""

    __slots__ = ("left", "stopped", "watcher")

    def __init__(self, receive: Receive, task: asyncio.Task) -> None:
        self.left = self.stopped = False
        self.watcher = asyncio.ensure_future(self._watch(receive, task))

    async def _watch(self, receive: Receive, task: asyncio.Task) -> None:
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except asyncio.CancelledError:
            # stop()'s cancel, ended quietly: a task that ends cancelled keeps its CancelledError, whose traceback
            # holds this frame and so the watch and its task, a cycle (with the request's objects in it) that only
            # the garbage collector frees: every request's, ~0.06 ms of collection each on the bundled model
            return
        except Exception:  # a server whose receive fails once the response is over: nothing to watch
            return
        if not self.stopped:  # uvicorn also says "disconnect" once the response is complete
            self.left = True
            task.cancel()

    def stop(self) -> None:
        self.stopped = True
        self.watcher.cancel()


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """`await work`, cancelled as soon as the client leaves (then `ClientDisconnected`). Call it once
    the request body has been read: from then on `receive` only has the disconnect to tell."""
    task = asyncio.current_task()
    assert task is not None
    watch = DisconnectWatch(receive, task)
    try:
        return await work
    except asyncio.CancelledError:
        if not watch.left or task.uncancel() > 0:  # not (only) our own cancel: pass it on
            raise
        REQUEST_DISCONNECTS.inc()
        raise ClientDisconnected() from None
    finally:
        watch.stop()
