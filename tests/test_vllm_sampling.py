"""The adapter from Choir's `Sampling` to vLLM's SamplingParams (choir/engine/vllm/sampling.py): every
field under vLLM's name, the model's defaults under the request's values, vLLM's refusals as 400s, and
fan-out's children each with their own params and seed from one translation."""

import msgspec
import pytest

from choir.core.errors import EngineRejected
from choir.engine.sampling import Constraint, RepetitionDetection, Sampling
from choir.engine.vllm.sampling import SamplingAdapter, sampling_params


def test_every_field_reaches_vllm_under_its_name():
    params = sampling_params(Sampling(
        max_tokens=7, stream=True, stop=["x"], stop_token_ids=[9], ignore_eos=True, min_tokens=2, logprobs=3,
        prompt_logprobs=1, include_stop_str_in_output=True, skip_special_tokens=False,
        spaces_between_special_tokens=False, structured_outputs=Constraint(regex="a+"), seed=5, temperature=0.3,
        top_p=0.9, top_k=4, min_p=0.1, presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.2,
        allowed_token_ids=[4, 5], bad_words=["no"], logit_bias={7: 1.5}, thinking_token_budget=8,
        repetition_detection=RepetitionDetection(max_pattern_size=4, min_pattern_size=2, min_count=3),
        stream_interval=2, watermarking=None, extra_args={"k": 1}), {})
    assert (params.n, params.max_tokens, params.output_kind.name, params.stop, params.stop_token_ids) == \
        (1, 7, "DELTA", ["x"], [9])
    assert (params.ignore_eos, params.min_tokens, params.logprobs, params.prompt_logprobs) == (True, 2, 3, 1)
    assert params.include_stop_str_in_output and not params.skip_special_tokens
    assert not params.spaces_between_special_tokens and params.structured_outputs.regex == "a+"
    assert (params.seed, params.temperature, params.top_p, params.top_k, params.min_p) == (5, 0.3, 0.9, 4, 0.1)
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, -0.5, 1.2)
    assert (params.allowed_token_ids, params.bad_words, params.logit_bias) == ([4, 5], ["no"], {7: 1.5})
    assert (params.thinking_token_budget, params.stream_interval, params.extra_args) == (8, 2, {"k": 1})
    assert params.repetition_detection.min_count == 3


def test_defaults_apply_under_the_requests_values_and_never_size_the_budget():
    defaults = {"temperature": 0.6, "top_p": 0.8, "max_tokens": 99}
    params = sampling_params(Sampling(max_tokens=5, top_p=0.5), defaults)
    assert (params.temperature, params.top_p, params.max_tokens, params.output_kind.name) == \
        (0.6, 0.5, 5, "FINAL_ONLY")
    assert defaults == {"temperature": 0.6, "top_p": 0.8, "max_tokens": 99}  # left as it was


def test_logprob_token_ids_replace_the_top_logprobs():
    params = sampling_params(Sampling(max_tokens=5, logprobs=2, logprob_token_ids=[5, 9]), {})
    assert params.logprobs is None and params.logprob_token_ids == [5, 9]


@pytest.mark.parametrize("sampling, param", [
    (Sampling(max_tokens=2, top_p=0.0), "top_p"),
    (Sampling(max_tokens=2, min_tokens=3), None),
    (Sampling(max_tokens=2, structured_outputs=Constraint(regex="a", choice=["b"])), None),
])
def test_vllms_refusals_are_engine_rejections(sampling, param):
    with pytest.raises(EngineRejected) as raised:
        SamplingAdapter({})(sampling)
    assert raised.value.status == 400 and raised.value.param == param and raised.value.message.endswith(".")


def test_each_request_gets_its_own_params_and_each_child_its_seed():
    adapter = SamplingAdapter({})
    parent = Sampling(max_tokens=5, seed=7, temperature=0.5)
    children = [adapter(msgspec.structs.replace(parent, seed=7 + i)) for i in range(3)]
    assert [child.seed for child in children] == [7, 8, 9]
    assert len({id(child) for child in children}) == 3 and {child.temperature for child in children} == {0.5}
    unseeded = Sampling(max_tokens=5)
    first, second = adapter(unseeded), adapter(unseeded)
    assert first is not second and first.seed is None and second.seed is None
    other = adapter(Sampling(max_tokens=6, seed=8))  # differs in more than the seed: translated anew
    assert (other.max_tokens, other.seed, other.temperature) == (6, 8, 1.0)
