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
