"""What an operator may ask of an engine, as vLLM's development routes ask it (choir/app/routes/operator.py):
its caches reset, generation paused and resumed, sleep and wake, the profiler, a call on every worker, and what it
was started with. Every engine has it, pooling ones too. What the engine cannot do (sleep without
--enable-sleep-mode, a profiler without --profiler-config) is an `EngineRejected` naming why."""

from typing import Any, Literal, Protocol

# vLLM's PauseMode: abort what runs, wait for it, or keep it frozen until resumed.
PauseMode = Literal["abort", "wait", "keep"]
PAUSE_MODES: tuple[PauseMode, ...] = ("abort", "wait", "keep")
DEV_MODE_STATE_KEY = "dev_mode"  # app state: whether the operator routes are served (CHOIR_DEV_MODE)


class Operator(Protocol):
    async def reset_prefix_cache(self, reset_running_requests: bool = False, reset_external: bool = False) -> bool:
        """False: some blocks are still held (by running requests): the caller may retry."""
        ...

    async def reset_mm_cache(self) -> None: ...

    async def pause(self, mode: PauseMode = "abort", clear_cache: bool = True) -> None: ...

    async def resume(self) -> None: ...

    async def is_paused(self) -> bool: ...

    async def sleep(self, level: int = 1, mode: PauseMode = "abort") -> None: ...

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        """True once fully awake (every tag, when `tags` names only some)."""
        ...

    async def is_sleeping(self) -> bool: ...

    async def start_profile(self, prefix: str | None = None) -> None: ...

    async def stop_profile(self) -> None: ...

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple[str, ...] = (),
                             kwargs: dict[str, str] | None = None) -> list[Any]:
        """`method` on every worker; each result as JSON can hold it (None, an object, a list, else its text)."""
        ...

    async def server_info(self, as_json: bool = False) -> dict[str, Any]:
        """The engine's configuration (text, or JSON), its VLLM_* environment (no keys) and the system's."""
        ...

    def kv_event_sources(self) -> dict[str, Any]:
        """Where each engine rank publishes its KV-cache events (vLLM's --kv-events-config), for a router."""
        ...
