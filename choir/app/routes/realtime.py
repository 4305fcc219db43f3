"""WebSocket /v1/realtime: streamed speech to text, vLLM's realtime protocol (choir/app/serving/realtime.py). Not a
spec operation: OpenAPI describes no websockets; docs/api/audio.md describes its events."""

from litestar import WebSocket, websocket

from choir.app.serving.realtime import RealtimeSession
from choir.plugins.pipeline import SocketPipelineDependency


@websocket("/v1/realtime")
async def realtime(socket: WebSocket, socket_pipeline: SocketPipelineDependency) -> None:
    await RealtimeSession(socket, socket_pipeline.engine, socket_pipeline.audio).run()


REALTIME_HANDLERS = [realtime]
