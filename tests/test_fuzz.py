"""Schemathesis against spec/openapi.yaml with the app in-process over a fake engine: no 5xx, and no
response that breaks the spec (status codes, content types, bodies), for a bounded number of examples."""

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from app.asgi import create_app
from core.settings import Settings
from plugins.spec import SPEC_DIR
from tests.fakes import FakeEngine, fake_engine_factory

KEY = "fuzz-key"
app = create_app(Settings(served_model_name="fake-model", api_keys=(KEY,)),
                 engine_factory=fake_engine_factory(FakeEngine()))
app.state["engine"] = FakeEngine()  # schemathesis' ASGI client does not run the lifespan
schema = schemathesis.openapi.from_path(SPEC_DIR / "openapi.yaml")
schema.app = app


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors_and_responses_follow_the_spec(case):
    # positive_data_acceptance is left out: a request the schema admits may still be refused with a
    # clear 400 for reasons no schema says (a prompt over the context, min_tokens > max_tokens, ...).
    case.call_and_validate(headers={"Authorization": f"Bearer {KEY}"}, excluded_checks=[positive_data_acceptance])
