"""Schemathesis against choir/spec/openapi.yaml with the app in-process over a fake engine, for a bounded
number of examples per operation: with the API key, no 5xx and no response that breaks the spec
(status codes, content types, bodies); without it (no header, a wrong key, another scheme), a 401 on
every operation but the open ones. Either way every error, also one inside a stream, is in OpenAI's
shape (Anthropic's on the Messages API), and a `data:` stream ends with one `[DONE]`."""

import json
from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.checks import positive_data_acceptance

from choir.app.asgi import create_app
from choir.core.settings import Settings
from choir.engine.roles import Engines
from choir.plugins.auth import METRICS, OPEN
from choir.plugins.spec import SPEC_DIR
from tests.fakes import FakeEngine, fake_engine_factory

KEY = "fuzz-key"
OPEN_PATHS = {*OPEN, METRICS}  # the docs (/schema) are open too, but not in the spec
app = create_app(Settings(served_model_name="fake-model", api_keys=(KEY,)),
                 engine_factory=fake_engine_factory(FakeEngine()))
app.state["engine"] = FakeEngine()  # schemathesis' ASGI client does not run the lifespan
app.state["engines"] = Engines({"generate": app.state["engine"]})
schema = schemathesis.openapi.from_path(SPEC_DIR / "openapi.yaml")
schema.app = app

FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck))


def _header(response: Any, name: str) -> str | None:
    values = response.headers.get(name.lower())
    return values[0] if values else None


def error_shape_problem(body: Any) -> str | None:
    """What keeps `body` from OpenAI's error shape: {"error": {"message": str, "type": str,
    "param": str | null, "code": ...}}; None when it has it."""
    if not isinstance(body, dict) or set(body) != {"error"}:
        return f"not an object with only `error`: {body!r:.300}"
    error = body["error"]
    if not isinstance(error, dict):
        return f"`error` is not an object: {error!r:.300}"
    missing = {"message", "type", "param", "code"} - set(error)
    if missing:
        return f"`error` lacks {sorted(missing)}: {error!r:.300}"
    if not isinstance(error["message"], str) or not error["message"]:
        return f"`error.message` is not a non-empty string: {error!r:.300}"
    if not isinstance(error["type"], str) or not error["type"]:
        return f"`error.type` is not a non-empty string: {error!r:.300}"
    if error["param"] is not None and not isinstance(error["param"], str):
        return f"`error.param` is neither a string nor null: {error!r:.300}"
    if error["code"] is not None and not isinstance(error["code"], (str, int)):
        return f"`error.code` is neither a string, an integer nor null: {error!r:.300}"
    return None


def anthropic_shape_problem(body: Any) -> str | None:
    """What keeps `body` from Anthropic's error shape: {"type": "error", "error": {"type": str, "message": str},
    "request_id": ...}; None when it has it."""
    if not isinstance(body, dict) or body.get("type") != "error" or not isinstance(body.get("error"), dict):
        return f"not {{\"type\": \"error\", \"error\": {{...}}}}: {body!r:.300}"
    error = body["error"]
    if set(error) != {"type", "message"} or not all(isinstance(error[k], str) and error[k] for k in error):
        return f"`error` is not {{type, message}}, both non-empty strings: {error!r:.300}"
    return None


def _anthropic(case: Any) -> bool:
    return case.operation.definition.raw.get("x-choir-errors") == "anthropic"


def no_server_error(ctx, response, case) -> None:
    """Explicitly: no 5xx, whatever the request (the fake engine never fails on its own)."""
    if response.status_code >= 500:
        raise AssertionError(f"{response.status_code} for {case.method} {case.formatted_path}: "
                             f"{response.content[:500]!r}")


def errors_in_the_apis_shape(ctx, response, case) -> None:
    """Every 4xx/5xx is JSON in OpenAI's error shape (Anthropic's on its operations, with a `request-id`); in a
    `data:` stream, so is every error event, and the stream (unless the client cut it short) ends with exactly
    one `data: [DONE]`."""
    content_type = (_header(response, "content-type") or "").split(";")[0].strip()
    if response.status_code >= 400:
        if content_type != "application/json":
            raise AssertionError(f"a {response.status_code} that is not JSON ({content_type!r}): "
                                 f"{response.content[:300]!r}")
        body = json.loads(response.content)
        if _anthropic(case):
            problem = anthropic_shape_problem(body)
            if problem is None and _header(response, "request-id") != body.get("request_id"):
                problem = f"the request-id header is not the body's request_id: {response.headers!r}"
        else:
            problem = error_shape_problem(body)
        if problem:
            raise AssertionError(f"a {response.status_code} not in its API's error shape: {problem}")
    elif content_type == "text/event-stream":
        text = response.content.decode()
        payloads = [line[len("data: "):] for line in text.replace("\r\n", "\n").split("\n")
                    if line.startswith("data: ")]
        for payload in payloads:
            if payload == "[DONE]":
                continue
            event = json.loads(payload)
            if _anthropic(case) and isinstance(event, dict) and event.get("type") == "error":
                problem = anthropic_shape_problem({**event, "request_id": None})
                if problem:
                    raise AssertionError(f"an in-stream error not in Anthropic's error shape: {problem}")
            # The Responses API's events have a `type`; its error event is its own (`"type": "error"`).
            elif isinstance(event, dict) and "error" in event and "type" not in event:
                problem = error_shape_problem(event)
                if problem:
                    raise AssertionError(f"an in-stream error not in OpenAI's error shape: {problem}")
        if "event: " not in text and not response.stream_cut_short:  # chat and completions: data only
            if payloads.count("[DONE]") != 1 or payloads[-1] != "[DONE]":
                raise AssertionError(f"a stream that does not end with one [DONE]: {payloads[-3:]!r}")


def protected_without_the_key(ctx, response, case) -> None:
    """Without the right key, every operation but the open ones is a 401 that asks for a Bearer key."""
    if case.path in OPEN_PATHS:
        if response.status_code == 401:
            raise AssertionError(f"{case.path} is open, but answered 401 without a key")
        return
    if response.status_code != 401:
        raise AssertionError(f"{case.method} {case.formatted_path} answered {response.status_code} without the key: "
                             f"{response.content[:300]!r}")
    if _header(response, "www-authenticate") != "Bearer":
        raise AssertionError(f"a 401 without `WWW-Authenticate: Bearer`: {response.headers!r}")


@schema.parametrize()
@settings(FUZZ, max_examples=40)
def test_no_server_errors_and_responses_follow_the_spec(case):
    # positive_data_acceptance is left out: a request the schema admits may still be refused with a
    # clear 400 for reasons no schema says (a prompt over the context, min_tokens > max_tokens, ...).
    case.call_and_validate(headers={"Authorization": f"Bearer {KEY}"}, excluded_checks=[positive_data_acceptance],
                           additional_checks=[no_server_error, errors_in_the_apis_shape])


# What a caller without the key sends: nothing, the random Bearer token schemathesis generates, the
# key under another scheme, a near miss, an empty token.
WITHOUT_THE_KEY = st.sampled_from([None, "generated", f"Basic {KEY}", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}",
                                   "Bearer ", KEY])


@schema.parametrize()
@schema.given(authorization=WITHOUT_THE_KEY)
@settings(FUZZ, max_examples=15)
def test_without_the_key_every_protected_operation_is_a_401(case, authorization):
    headers = case.headers if case.headers is not None else {}
    if authorization != "generated" or headers.get("Authorization", "").strip() == f"Bearer {KEY}":
        headers.pop("Authorization", None)
        if authorization is not None:
            headers["Authorization"] = authorization
    case.headers = headers
    case.call_and_validate(excluded_checks=[positive_data_acceptance],
                           additional_checks=[no_server_error, errors_in_the_apis_shape, protected_without_the_key])
