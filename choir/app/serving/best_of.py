"""`best_of`: sample best_of candidates per prompt, return the n likeliest (OpenAI's rule: the highest
log probability per token). The candidates are fan-out children like any other (seed + i), so
they are known only once all have finished: no stream. Usage counts every candidate's tokens."""

from dataclasses import replace

from choir.core.errors import bad_request
from choir.core.protocol.common import SamplingFields
from choir.engine.outputs import EngineOutput
from choir.plugins.fanout import Choice


def best_of_candidates(request: SamplingFields) -> int | None:
    """How many candidates each prompt samples, or None when that is n (no choosing)."""
    best_of = request.best_of
    if best_of is None or best_of == request.n:
        return None
    if best_of < request.n:
        raise bad_request(f"best_of must be at least n ({request.n}), got {best_of}.", "best_of")
    if request.stream:
        raise bad_request("best_of cannot be used with stream: the best are known only once all candidates have "
                          "finished. Leave stream off, or use n.", "best_of")
    return best_of


def ranking_logprobs(logprobs: int | None, candidates: int | None) -> int | None:
    """Ranking needs each candidate's cumulative logprob, which the engine keeps only when logprobs are on."""
    return logprobs if candidates is None else (logprobs or 0)


def keep_best(choices: list[Choice], outputs: list[EngineOutput], n: int) -> tuple[list[Choice], list[EngineOutput]]:
    """Per prompt, the n candidates with the highest mean token logprob, indexed 0..n-1 again."""
    by_prompt: dict[int, list[tuple[Choice, EngineOutput]]] = {}
    for choice, output in zip(choices, outputs, strict=True):
        by_prompt.setdefault(choice.prompt_index, []).append((choice, output))
    kept_choices, kept_outputs = [], []
    for prompt_index, candidates in sorted(by_prompt.items()):
        ranked = sorted(candidates, key=lambda pair: _mean_logprob(pair[1]), reverse=True)  # stable on ties
        for rank, (choice, output) in enumerate(ranked[:n]):
            kept_choices.append(replace(choice, index=prompt_index * n + rank))
            kept_outputs.append(output)
    return kept_choices, kept_outputs


def _mean_logprob(output: EngineOutput) -> float:
    completion = output.outputs[0]
    if completion.cumulative_logprob is None or not completion.token_ids:
        return float("-inf")
    return completion.cumulative_logprob / len(completion.token_ids)
