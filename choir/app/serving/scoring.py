"""POST /rerank and /score: a cross-encoder (the rerank role's engine) scores query and document pairs,
one engine request per pair, concurrently. /rerank sorts the documents by relevance (vLLM's, Jina's and
Cohere's shape); /score keeps the pairs' order (vLLM's: one text_1 against every text_2, or pair by pair)."""

from choir.app.request_ids import now
from choir.app.serving.models import pooling_model
from choir.app.serving.pooling import check_fits, refuse_pooling_unserved, run_all, usage_tokens
from choir.core.errors import bad_request
from choir.core.protocol.pooling import (
    PoolingUsage,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
)
from choir.engine.protocol import PoolingEngine, Prompt, RenderOptions
from choir.plugins.pipeline import Pipeline


async def rerank(pipeline: Pipeline, request: RerankRequest, response_id: str) -> RerankResponse:
    model, engine = pooling_model(pipeline, "rerank", request.model)
    refuse_pooling_unserved(request)
    documents = [request.documents] if isinstance(request.documents, str) else request.documents
    if not documents:
        raise bad_request("documents is empty: send at least one document to rank.", "documents")
    pipeline.fan_out.check_prompts(len(documents), 1, "documents")
    texts = [doc if isinstance(doc, str) else doc.text for doc in documents]
    where = ["documents" if isinstance(request.documents, str) else f"documents[{i}]" for i in range(len(texts))]
    prompts = await _pair_prompts(engine, [(request.query, text) for text in texts], where, "query",
                                  request.max_tokens_per_doc)
    scores = await _scores(engine, prompts, response_id, request.use_activation)
    ranked = sorted(range(len(texts)), key=lambda i: scores[i], reverse=True)[:request.top_n]
    results = [RerankResult(index=i, relevance_score=scores[i],
                            document=RerankDocument(text=texts[i]) if request.return_documents else None)
               for i in ranked]
    tokens = usage_tokens(prompts)
    return RerankResponse(id=response_id, model=model, usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens),
                          results=results)


async def score(pipeline: Pipeline, request: ScoreRequest, response_id: str) -> ScoreResponse:
    model, engine = pooling_model(pipeline, "rerank", request.model)
    refuse_pooling_unserved(request)
    firsts = [request.text_1] if isinstance(request.text_1, str) else request.text_1
    seconds = [request.text_2] if isinstance(request.text_2, str) else request.text_2
    for name, texts in (("text_1", firsts), ("text_2", seconds)):
        if not texts:
            raise bad_request(f"{name} is empty: send a text, or a list of texts.", name)
    if len(firsts) == 1:
        firsts = firsts * len(seconds)  # one against many
    elif len(firsts) != len(seconds):
        raise bad_request(f"text_1 has {len(firsts)} texts and text_2 {len(seconds)}: send one text_1 to score "
                          "against every text_2, or as many of each to score pair by pair.", "text_2")
    pipeline.fan_out.check_prompts(len(seconds), 1, "text_2")
    where = [f"text_2[{i}]" if isinstance(request.text_2, list) else "text_2" for i in range(len(seconds))]
    prompts = await _pair_prompts(engine, list(zip(firsts, seconds, strict=True)), where, "text_1",
                                  request.max_tokens_per_doc)
    scores = await _scores(engine, prompts, response_id, request.use_activation)
    tokens = usage_tokens(prompts)
    return ScoreResponse(id=response_id, created=now(), model=model,
                         data=[ScoreData(index=i, score=value) for i, value in enumerate(scores)],
                         usage=PoolingUsage(prompt_tokens=tokens, total_tokens=tokens))


async def _pair_prompts(engine: PoolingEngine, pairs: list[tuple[str, str]], where: list[str], first_field: str,
                        max_second_tokens: int | None) -> list[Prompt]:
    prompts = []
    for (first, second), field in zip(pairs, where, strict=True):
        prompt = await engine.render_pair(first, second, max_second_tokens)
        if len(prompt.token_ids) > engine.max_model_len:
            [alone] = await engine.render_completion([first], RenderOptions(add_special_tokens=False))
            if len(alone.token_ids) >= engine.max_model_len:  # the query is too long by itself
                field = first_field
        check_fits(engine, prompt, field, "Its pair is too long: shorten the query or the document (or set "
                                          "max_tokens_per_doc).")
        prompts.append(prompt)
    return prompts


async def _scores(engine: PoolingEngine, prompts: list[Prompt], response_id: str,
                  activation: bool | None) -> list[float]:
    """A cross-encoder has one label: its value is the pair's score."""
    async def one(prompt: Prompt, request_id: str) -> float:
        values = await engine.classify(prompt, request_id, activation)
        return values[0]

    return await run_all(prompts, response_id, one)
