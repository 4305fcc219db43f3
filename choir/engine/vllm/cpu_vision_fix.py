"""A vLLM general plugin (entry point `vllm.general_plugins`, so it runs in every vLLM process: the API's, the
architecture check's and the engine's): vision-language models import without torchvision.

The CPU install has no torchvision (PyPI's breaks `import transformers` beside the CPU torch). vLLM 0.32's
LLaVA family (and Qwen2-VL, Gemma 3, ...) imports `pixtral.py`, which imports transformers' torchvision-backed
Pixtral image processor only for its `_num_image_tokens`; the PIL-backed module beside it defines the same
function. Without torchvision, that name is given the PIL module, and the model loads. A GPU install (vLLM's
own torchvision) is left as it is.
"""

import importlib
import importlib.util
import sys

TORCHVISION_MODULE = "transformers.models.pixtral.image_processing_pixtral"
PIL_MODULE = "transformers.models.pixtral.image_processing_pil_pixtral"


def register() -> None:
    if importlib.util.find_spec("torchvision") is not None or TORCHVISION_MODULE in sys.modules:
        return
    try:
        sys.modules[TORCHVISION_MODULE] = importlib.import_module(PIL_MODULE)
    except ImportError:  # another transformers: vLLM's own import error then says what is missing
        pass
