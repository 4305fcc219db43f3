"""GET /metrics in Prometheus text format: vLLM's own engine metrics (vllm:num_requests_running,
vllm:num_requests_waiting, KV-cache usage, token counters: AsyncLLM registers them in this process)
and Choir's: requests by route and status, fan-out children, stream disconnects, and end-to-end
latency and time-to-first-chunk histograms; /v1/realtime's websocket sessions under vLLM's names. Open like /health.

With several API processes (choir/cli/serve.py) prometheus_client runs in its multiprocess mode, as vLLM's does:
each process writes its samples to PROMETHEUS_MULTIPROC_DIR, and any process answers /metrics with all of
them merged (counters and histograms summed; vLLM's engine gauges are "mostrecent": once, not N times)."""

import os
from contextlib import suppress
from functools import cache
from typing import Any

from litestar import Response
from litestar.config.app import AppConfig
from litestar.plugins import InitPlugin
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from choir.plugins.spec import operation

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

REQUESTS = Counter("choir_requests", "HTTP requests answered, by operation", ["route", "method", "status"])
LATENCY = Histogram("choir_request_duration_seconds", "From request to the last response byte", ["route"],
                    buckets=LATENCY_BUCKETS)
TIME_TO_FIRST_CHUNK = Histogram("choir_time_to_first_chunk_seconds",
                                "Streams: from request to the first event sent", ["route"], buckets=LATENCY_BUCKETS)
FANOUT_CHILDREN = Counter("choir_fanout_children", "Child engine requests made by fan-out (n > 1)")
STREAM_DISCONNECTS = Counter("choir_stream_disconnects", "Streams the client left before they ended")
REQUEST_DISCONNECTS = Counter("choir_request_disconnects",
                              "Non-streamed requests the client left before the response was ready")
# /v1/realtime's sessions, under the names vLLM's server gives them (its WebSocketMetricsMiddleware)
WEBSOCKETS_ACTIVE = Gauge("vllm:websocket_connections_active", "Number of currently active WebSocket connections.",
                          multiprocess_mode="livesum")
WEBSOCKETS = Counter("vllm:websocket_connections", "Total number of WebSocket connections.")
WEBSOCKET_SECONDS = Histogram("vllm:websocket_connection_duration_seconds", "Duration of WebSocket connections in "
                              "seconds.", buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800))


@cache
def registry() -> CollectorRegistry:
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    merged = CollectorRegistry()
    MultiProcessCollector(merged)
    return merged


@operation("metrics")
async def metrics() -> Response:
    _register_websocket_metrics()
    return Response(generate_latest(registry()), media_type=CONTENT_TYPE_LATEST)


def _register_websocket_metrics() -> None:
    """An engine started in this process unregisters every "vllm:" collector it finds (vLLM's
    unregister_vllm_metrics, run when its stat loggers start): the websocket ones are put back for each scrape."""
    for collector in (WEBSOCKETS_ACTIVE, WEBSOCKETS, WEBSOCKET_SECONDS):
        with suppress(ValueError):  # registered already
            REGISTRY.register(collector)


def record_request(route: str, method: str, status: int, latency: float, first_chunk: float | None) -> None:
    """Called once per request by choir/app/request_log.py's `watch_request`, which watches every request."""
    requests, latencies, first_chunks = _children(route, method, status)
    requests.inc()
    latencies.observe(latency)
    if first_chunk is not None:
        first_chunks.observe(first_chunk)


@cache
def _children(route: str, method: str, status: int) -> tuple[Any, Any, Any]:
    """The labelled series a request counts in, looked up once (routes, methods and statuses are few)."""
    return REQUESTS.labels(route, method, str(status)), LATENCY.labels(route), TIME_TO_FIRST_CHUNK.labels(route)


class MetricsPlugin(InitPlugin):
    __slots__ = ()

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        app_config.route_handlers.append(metrics)
        return app_config
