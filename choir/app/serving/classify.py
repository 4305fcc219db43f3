"""POST /classify: inputs → the classify role's engine (one engine request each, concurrently) → each
input's probabilities over the model's labels, and the most probable label's name (vLLM's shape)."""

from choir.app.request_ids import now
from choir.app.serving.models import pooling_model
from choir.app.serving.pooling import check_fits, refuse_pooling_unserved, run_all, usage_tokens
from choir.app.serving.prompts import completion_prompts
from choir.core.errors import bad_request
from choir.core.protocol.pooling import ClassificationData, ClassificationRequest, ClassificationResponse, PoolingUsage
from choir.engine.protocol import Prompt, RenderOptions
from choir.plugins.pipeline import Pipeline


async def classify(pipeline: Pipeline, request: ClassificationRequest, response_id: str) -> ClassificationResponse:
    model, engine = pooling_model(pipeline, "classify", request.model)
    refuse_pooling_unserved(request)
    inputs = completion_prompts(request.input, "input")
    pipeline.fan_out.check_prompts(len(inputs), 1, "input")
    keep = engine.max_model_len if request.truncate_prompt_tokens == -1 else request.truncate_prompt_tokens
    if keep == 0:
        raise bad_request("truncate_prompt_tokens 0 leaves nothing to classify: send -1 (the model's context) or "
                          "a number of tokens to keep.", "truncate_prompt_tokens")
    prompts = await engine.render_completion(inputs, RenderOptions(add_special_tokens=request.add_special_tokens,
                                                                   truncate_prompt_tokens=keep))
    for index, prompt in enumerate(prompts):
        check_fits(engine, prompt, "input" if len(prompts) == 1 else f"input[{index}]",
                   "Shorten it, or set truncate_prompt_tokens.")

    async def one(prompt: Prompt, request_id: str) -> list[float]:
        return await engine.classify(prompt, request_id, request.use_activation)

    results = await run_all(prompts, response_id, one)
    labels = engine.labels
    data = []
    for index, probs in enumerate(results):
        best = max(range(len(probs)), key=probs.__getitem__)
        data.append(ClassificationData(index=index, label=labels[best] if best < len(labels) else None, probs=probs,
                                       num_classes=len(probs)))
    tokens = usage_tokens(prompts)
    return ClassificationResponse(id=response_id, created=now(), model=model, data=data,
                                  usage=PoolingUsage(prompt_tokens=tokens, total_tokens=tokens))
