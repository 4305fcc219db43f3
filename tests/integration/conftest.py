import gc
import os

import openai
import pytest

from tests.integration.server import Server, start_server


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Server:
    """One real server (bundled tiny model) for the whole test session."""
    server = start_server(tmp_path_factory.mktemp("choir") / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def direct_engine():
    """vLLM's AsyncLLM in this process, with Choir's engine flags for the bundled model, on its own loop."""
    import asyncio
    import threading

    from choir.core.settings import Settings
    from choir.engine.vllm.args import parse_engine_args
    from choir.engine.vllm.start import ENGINE_ENVIRONMENT

    for key, value in ENGINE_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    from vllm.platforms import current_platform
    from vllm.v1.engine.async_llm import AsyncLLM

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start():
        return AsyncLLM.from_engine_args(parse_engine_args(Settings(), on_cpu=current_platform.is_cpu()))

    engine = asyncio.run_coroutine_threadsafe(start(), loop).result(300)
    engine.loop = loop
    yield engine
    engine.shutdown()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    del engine  # now, while the interpreter is whole: AsyncLLM.__del__ fails at exit
    gc.collect()
