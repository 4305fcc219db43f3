"""vLLM's operator calls on one engine (AsyncLLM): what its development routes do, with what this engine cannot
do (sleep without --enable-sleep-mode, a profiler without --profiler-config) refused first, in one line."""

import asyncio
import dataclasses
import functools
from typing import Any

from choir.engine.operator import PauseMode
from choir.engine.protocol import EngineRejected
from choir.engine.vllm.errors import reraise


class VllmOperator:
    _engine: Any  # vLLM's AsyncLLM (VllmBase holds it)

    async def reset_prefix_cache(self, reset_running_requests: bool = False, reset_external: bool = False) -> bool:
        return bool(await self._call(self._engine.reset_prefix_cache(reset_running_requests, reset_external)))

    async def reset_mm_cache(self) -> None:
        await self._call(self._engine.reset_mm_cache())

    async def pause(self, mode: PauseMode = "abort", clear_cache: bool = True) -> None:
        await self._call(self._engine.pause_generation(mode=mode, clear_cache=clear_cache))

    async def resume(self) -> None:
        await self._call(self._engine.resume_generation())

    async def is_paused(self) -> bool:
        return bool(await self._call(self._engine.is_paused()))

    async def sleep(self, level: int = 1, mode: PauseMode = "abort") -> None:
        self._needs_sleep_mode()
        await self._call(self._engine.sleep(level, mode))

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        self._needs_sleep_mode()
        return bool(await self._call(self._engine.wake_up(tags)))

    async def is_sleeping(self) -> bool:
        return bool(await self._call(self._engine.is_sleeping()))

    async def start_profile(self, prefix: str | None = None) -> None:
        self._needs_profiler()
        await self._call(self._engine.start_profile(prefix) if prefix else self._engine.start_profile())

    async def stop_profile(self) -> None:
        self._needs_profiler()
        await self._call(self._engine.stop_profile())

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple[str, ...] = (),
                             kwargs: dict[str, str] | None = None) -> list[Any]:
        results = await self._call(self._engine.collective_rpc(method, timeout, args, kwargs or {}))
        return [result if result is None or isinstance(result, dict | list) else str(result)
                for result in results or ()]

    async def server_info(self, as_json: bool = False) -> dict[str, Any]:
        import pydantic
        from vllm.config import VllmConfig

        config = self._engine.vllm_config
        shown = (pydantic.TypeAdapter(VllmConfig).dump_python(config, mode="json", fallback=str) if as_json
                 else str(config))
        return {"vllm_config": shown, "vllm_env": _vllm_environment(),
                "system_env": await asyncio.to_thread(_system_environment)}

    def kv_event_sources(self) -> dict[str, Any]:
        sources = self._engine.get_kv_event_sources() or {}
        return {str(rank): _as_json(config) for rank, config in sources.items()}

    def _needs_sleep_mode(self) -> None:
        if not self._engine.model_config.enable_sleep_mode:
            raise EngineRejected("The engine was started without --enable-sleep-mode, so it cannot sleep or wake "
                                 "(and on a platform without sleep mode, such as vLLM's CPU build, it cannot be "
                                 "started with it).")

    def _needs_profiler(self) -> None:
        profiler = getattr(self._engine.vllm_config, "profiler_config", None)
        if profiler is None or profiler.profiler is None:
            raise EngineRejected("The engine was started without a profiler: start it with --profiler-config "
                                 "(e.g. --profiler-config.profiler torch) to profile it.")

    @staticmethod
    async def _call(awaitable: Any) -> Any:
        try:
            return await awaitable
        except Exception as exc:  # vLLM's refusal (a ValueError) is a 4xx; anything else stays what it was
            reraise(exc)


def _as_json(config: Any) -> Any:
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) and not isinstance(config, type) else config


def _vllm_environment() -> dict[str, Any]:
    """vLLM's environment as its server shows it: every VLLM_* setting, none whose name holds KEY."""
    import vllm.envs as envs
    from vllm.config.utils import normalize_value

    return {name: normalize_value(getattr(envs, name)) for name in dir(envs)
            if name.startswith("VLLM_") and "KEY" not in name and getattr(envs, name, None) is not None}


@functools.lru_cache(maxsize=1)
def _system_environment() -> dict[str, Any]:
    from vllm.collect_env import get_env_info

    return dict(get_env_info()._asdict())
