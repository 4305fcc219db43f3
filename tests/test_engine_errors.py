"""The engine seam's errors below HTTP: vLLM's own exception classes, refused or not (choir/engine/vllm/errors.py
matches them by name, so a rename in vLLM shows up here), and what the HTTP side makes of a bug."""

import pytest
from structlog.testing import capture_logs
from vllm.exceptions import QueueOverflowError, VLLMValidationError
from vllm.v1.engine.exceptions import EngineGenerateError

from choir.core.errors import EngineRejected
from choir.engine.vllm.errors import rejection, reraise
from tests.test_errors import error_of


def test_vllms_validation_error_is_a_400_naming_its_parameter():
    refused = rejection(VLLMValidationError("top_k must be -1 or at least 1, got 0.", parameter="top_k", value=0))
    assert refused is not None and refused.status == 400 and refused.param == "top_k"
    assert refused.message == "top_k must be -1 or at least 1, got 0."  # without vLLM's "(parameter=...)" tail


def test_a_value_error_inside_vllms_generate_wrapper_is_a_400():
    try:
        try:
            raise ValueError("Token id 99999 is out of vocabulary")
        except ValueError as cause:
            raise EngineGenerateError() from cause
    except EngineGenerateError as wrapped:
        refused = rejection(wrapped)
    assert refused is not None and refused.status == 400
    assert refused.message == "Token id 99999 is out of vocabulary."


def test_admission_control_keeps_its_status():
    refused = rejection(QueueOverflowError())
    assert refused is not None and refused.status == 503 and refused.message


@pytest.mark.parametrize("exc", [TypeError("got an unexpected keyword argument 'tmperature'"), KeyError("k"),
                                 RuntimeError("CUDA error"), EngineGenerateError()])
def test_anything_else_is_not_a_refusal(exc):
    """A TypeError is how a bug of Choir's own meets vLLM (a misspelt argument): vLLM's server answers it
    with a 500 too."""
    assert rejection(exc) is None
    with pytest.raises(type(exc)) as raised:
        reraise(exc)
    assert raised.value is exc


def test_reraise_keeps_the_cause():
    original = ValueError("bad")
    with pytest.raises(EngineRejected) as raised:
        reraise(original)
    assert raised.value.__cause__ is original


def test_sampling_params_a_bug_cannot_become_a_400(monkeypatch):
    """Only the call into vLLM is guarded: Choir's own code around it raises as it is."""
    from choir.app.serving.sampling import build_sampling_params
    from choir.core.protocol.completions import CompletionRequest
    from choir.engine.vllm import sampling as vllm_sampling

    def broken_params(**kwargs):
        raise TypeError("SamplingParams() got an unexpected keyword argument")

    _, *rest = vllm_sampling._vllm()
    monkeypatch.setattr(vllm_sampling, "_vllm", lambda: (broken_params, *rest))
    with pytest.raises(TypeError):
        vllm_sampling.sampling_params(build_sampling_params(CompletionRequest(prompt="x"), max_tokens=4), {})


@pytest.mark.parametrize("path, body", [("/tokenize", {"prompt": "x"}), ("/v1/models", None)])
def test_a_bug_outside_generation_has_a_request_id_too(client, fake_engine, monkeypatch, path, body):
    """Routes that make no response id still quote one in a 500: the caller's X-Request-Id, else a fresh
    one, the same in the message and in the log."""
    def broken(*args, **kwargs):
        raise TypeError("internal detail")

    monkeypatch.setattr(type(fake_engine), "render_completion", broken)
    monkeypatch.setattr(type(fake_engine), "adapters", property(broken), raising=False)
    send = (lambda **kw: client.post(path, json=body, **kw)) if body else (lambda **kw: client.get(path, **kw))
    with capture_logs() as logs:
        given = error_of(send(headers={"X-Request-Id": "given-1"}), 500)
        fresh = error_of(send(), 500)
    assert "given-1" in given and "internal detail" not in given
    errors = [entry for entry in logs if entry["event"] == "unhandled error"]
    requests = [entry for entry in logs if entry["event"] == "request"]
    assert [entry["request_id"] for entry in errors] == [entry["request_id"] for entry in requests][:2]
    assert errors[1]["request_id"] in fresh and errors[1]["request_id"] != "given-1"
