"""VllmEngine's LoRA adapters below HTTP, over a stub of vLLM's AsyncLLM whose engine-core calls take a
while (as the real round trip does), so that loads and unloads can overlap. The real engine's side is
tests/integration/test_models.py."""

import asyncio
from types import SimpleNamespace

import pytest
from vllm.v1.engine.exceptions import EngineDeadError

from choir.core.errors import AdapterError, EngineDead, EngineRejected, UnknownAdapter
from choir.engine.protocol import GenerateOptions, Prompt
from choir.engine.sampling import Sampling
from choir.engine.vllm.engine import VllmEngine


class StubAsyncLLM:
    def __init__(self) -> None:
        self.errored = False
        self.model_config = SimpleNamespace(max_model_len=64, get_diff_sampling_param=dict, is_multimodal_model=False,
                                            multimodal_config=None)
        self.vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(policy="fcfs"),
                                           parallel_config=SimpleNamespace(data_parallel_size=1,
                                                                           data_parallel_size_local=1,
                                                                           local_engines_only=False))
        self.renderer = SimpleNamespace(tokenizer=SimpleNamespace(max_token_id=99))
        self.loaded: dict[int, str] = {}  # the engine's adapters: id → path
        self.lora_requests: list = []
        self.dies_on_call = False

    async def add_lora(self, request) -> bool:
        await asyncio.sleep(0.01)
        if self.dies_on_call:
            raise EngineDeadError()
        if "missing" in request.lora_path:
            raise RuntimeError(f"Call to add_lora method failed: Worker failed with error 'No adapter found for "
                               f"{request.lora_path}', please check the stack trace above for the root cause")
        self.loaded[request.lora_int_id] = request.lora_path
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        await asyncio.sleep(0.01)
        if self.dies_on_call:
            raise EngineDeadError()
        del self.loaded[lora_id]
        return True

    async def generate(self, engine_input, params, request_id, **extra):
        self.lora_requests.append(extra.get("lora_request"))
        yield "output"


@pytest.fixture
def stub() -> StubAsyncLLM:
    return StubAsyncLLM()


@pytest.fixture
def engine(stub) -> VllmEngine:
    return VllmEngine(stub, SimpleNamespace(served_model_name=["base", "alias"], model="/models/base"), "test")


async def test_loads_at_once_get_an_id_each(engine, stub):
    await asyncio.gather(*(engine.load_adapter(f"a{i}", f"/adapters/{i}") for i in range(4)))
    assert engine.adapters == {f"a{i}": f"/adapters/{i}" for i in range(4)}
    assert sorted(stub.loaded.values()) == [f"/adapters/{i}" for i in range(4)]  # four ids, four adapters


async def test_one_name_loaded_twice_at_once_is_taken_once(engine, stub):
    results = await asyncio.gather(engine.load_adapter("a", "/adapters/1"), engine.load_adapter("a", "/adapters/2"),
                                   return_exceptions=True)
    assert results[0] is None and isinstance(results[1], AdapterError) and results[1].about == "name"
    assert "load_inplace" in str(results[1])
    assert engine.adapters == {"a": "/adapters/1"} and list(stub.loaded.values()) == ["/adapters/1"]


async def test_a_served_name_is_taken(engine):
    with pytest.raises(AdapterError, match="taken"):
        await engine.load_adapter("alias", "/adapters/1")


async def test_load_inplace_replaces_under_the_same_id_and_keeps_the_old_one_on_failure(engine, stub):
    await engine.load_adapter("a", "/adapters/1")
    [lora_id] = stub.loaded
    await engine.load_adapter("a", "/adapters/2", load_inplace=True)
    assert engine.adapters == {"a": "/adapters/2"} and stub.loaded == {lora_id: "/adapters/2"}
    with pytest.raises(AdapterError, match="No adapter found for /adapters/missing"):
        await engine.load_adapter("a", "/adapters/missing", load_inplace=True)
    assert engine.adapters == {"a": "/adapters/2"}


async def test_a_bad_path_says_why_in_one_line(engine):
    with pytest.raises(AdapterError) as raised:
        await engine.load_adapter("a", "/adapters/missing")
    assert raised.value.about == "path" and "\n" not in str(raised.value) and "stack trace" not in str(raised.value)
    assert engine.adapters == {}


async def test_a_dead_engine_is_engine_dead_not_a_bad_adapter(engine, stub):
    await engine.load_adapter("a", "/adapters/1")
    stub.dies_on_call = True
    with pytest.raises(EngineDead):
        await engine.load_adapter("b", "/adapters/2")
    with pytest.raises(EngineDead):
        await engine.unload_adapter("a")
    stub.errored = True
    with pytest.raises(EngineDead):
        await engine.load_adapter("c", "/adapters/3")


async def test_unload_frees_the_adapter_and_the_name(engine, stub):
    await engine.load_adapter("a", "/adapters/1")
    await engine.unload_adapter("a")
    assert engine.adapters == {} and stub.loaded == {}
    with pytest.raises(UnknownAdapter):
        await engine.unload_adapter("a")


async def test_a_request_whose_adapter_was_unloaded_meanwhile_is_a_404_naming_the_model(engine, stub):
    await engine.load_adapter("a", "/adapters/1")
    prompt, options = Prompt(token_ids=[1], text="x", engine_input={}), GenerateOptions(adapter="a")
    params = Sampling(max_tokens=4)
    assert [output async for output in engine.generate(prompt, params, "r1", options)] == ["output"]
    assert stub.lora_requests[0].lora_path == "/adapters/1"
    await engine.unload_adapter("a")
    with pytest.raises(EngineRejected) as raised:
        [output async for output in engine.generate(prompt, params, "r2", options)]
    assert raised.value.status == 404 and raised.value.param == "model" and "`a`" in raised.value.message
    assert len(stub.lora_requests) == 1  # it never reached the engine


async def test_the_parent_is_the_base_model_name_given_else_the_first_served_name(engine):
    await engine.load_adapter("a", "/adapters/1")
    await engine.load_adapter("b", "/adapters/2", base_model_name="alias")
    assert (engine.adapter_parent("a"), engine.adapter_parent("b")) == ("base", "alias")


def test_the_model_root_is_the_model_as_configured(stub):
    """Under HF_HUB_OFFLINE vLLM's args hold the local snapshot's path; /v1/models shows what was asked for."""
    args = SimpleNamespace(served_model_name=["m"], model="/hub/snapshots/0123")
    assert VllmEngine(stub, args, "test", "org/model").model_root == "org/model"
    assert VllmEngine(stub, args, "test").model_root == "/hub/snapshots/0123"


def test_an_engine_without_a_tokenizer_stops_start_up_in_one_line(stub):
    from choir.core.settings import SettingsError

    stub.renderer = SimpleNamespace(tokenizer=None)  # --skip-tokenizer-init
    with pytest.raises(SettingsError, match="--skip-tokenizer-init"):
        VllmEngine(stub, SimpleNamespace(served_model_name=["m"], model="/m"), "test")
