"""A vLLM general plugin (entry point `vllm.general_plugins`, so it runs in every vLLM process: the API's, the
architecture check's and the engine's): models that import transformers' image processors import without
torchvision.

The CPU install has no torchvision (PyPI's breaks `import transformers` beside the CPU torch). vLLM 0.32 imports
two of transformers' torchvision-backed image-processor modules for a helper the PIL-backed module beside each
defines too: `pixtral.py` (the LLaVA family, Qwen2-VL, Gemma 3, ...) for Pixtral's `_num_image_tokens`, and
`qwen2_vl.py` (which Qwen2.5-VL, Qwen2.5-Omni and Qwen3-ASR import in turn) for Qwen2-VL's `smart_resize`.
Without torchvision, each such name is given its PIL module, and the model loads. A GPU install (vLLM's own
torchvision) is left as it is.
"""

import importlib
import importlib.util
import sys

# transformers' torchvision-backed module -> the PIL-backed one beside it
PIL_MODULES = {
    "transformers.models.pixtral.image_processing_pixtral": "transformers.models.pixtral.image_processing_pil_pixtral",
    "transformers.models.qwen2_vl.image_processing_qwen2_vl":
        "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl",
}


def register() -> None:
    if importlib.util.find_spec("torchvision") is not None:
        return
    for torchvision_module, pil_module in PIL_MODULES.items():
        if torchvision_module in sys.modules:
            continue
        try:
            sys.modules[torchvision_module] = importlib.import_module(pil_module)
        except ImportError:  # another transformers: vLLM's own import error then says what is missing
            pass
