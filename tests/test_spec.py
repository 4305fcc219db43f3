"""choir/spec/openapi.yaml is the source of the routes: the app's OpenAPI must agree with it."""

import pytest
from litestar.exceptions import ImproperlyConfiguredException
from openapi_spec_validator import validate

from choir.app.asgi import create_app
from choir.core.protocol.schema import component_schemas
from choir.core.settings import Settings
from choir.plugins.spec import METHODS, SPEC_DIR, SpecConfig, load_spec
from tests.fakes import FakeEngine, fake_engine_factory
from tests.spec_copy import spec_copy


def operations(doc: dict) -> set[tuple[str, str, str]]:
    return {(path, method, op["operationId"]) for path, item in doc["paths"].items()
            for method, op in item.items() if method in METHODS}


def make_app(spec_dir=SPEC_DIR):
    return create_app(Settings(), engine_factory=fake_engine_factory(FakeEngine()), spec=SpecConfig(spec_dir))


def test_spec_and_generated_openapi_are_valid_and_agree():
    spec = load_spec()
    generated = make_app().openapi_schema.to_schema()
    validate(spec)
    validate(generated)
    assert operations(generated) == operations(spec)
    for path, item in spec["paths"].items():
        for method, op in item.items():
            ours = generated["paths"][path][method]
            if "application/json" in op.get("requestBody", {}).get("content", {}):  # a multipart upload: its own
                assert _required_fields(spec, op) == _required_fields(generated, ours), (path, method)
            assert set(ours["responses"]) >= {code for code in op["responses"] if code.startswith("2")}


def _required_fields(doc: dict, op: dict) -> set[str]:
    schema = op["requestBody"]["content"]["application/json"]["schema"]
    if "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return set(schema.get("required", []))


def test_spec_schemas_are_the_wire_types():
    """The spec's component schemas are exactly what choir/core/protocol's Structs accept and produce
    (after changing a Struct: `python -m choir.core.protocol.schema`)."""
    assert load_spec()["components"]["schemas"] == component_schemas()


def test_post_operations_answer_200_as_the_spec_says():
    routes = {(r.path, m): h for r in make_app().routes for h in getattr(r, "route_handlers", [])
              for m in h.http_methods}
    assert routes[("/v1/completions", "POST")].status_code == 200
    assert routes[("/v1/chat/completions", "POST")].status_code == 200


def test_an_operation_without_handler_stops_startup(tmp_path):
    def add(doc):
        doc["paths"]["/v1/nothing"] = {"post": {"operationId": "createNothing", "responses": {"200": {
            "description": "x"}}}}

    with pytest.raises(ImproperlyConfiguredException, match="createNothing"):
        make_app(spec_copy(tmp_path, openapi=add))


def test_a_handler_outside_the_spec_stops_startup(tmp_path):
    def remove(doc):
        del doc["paths"]["/version"]

    with pytest.raises(ImproperlyConfiguredException, match="'version'"):
        make_app(spec_copy(tmp_path, openapi=remove))


def test_routes_follow_the_spec(tmp_path):
    """The path is the spec's: moving it in the spec moves the route."""
    def move(doc):
        doc["paths"]["/v1/engine-version"] = doc["paths"].pop("/version")

    from litestar.testing import TestClient

    with TestClient(make_app(spec_copy(tmp_path, openapi=move))) as client:
        assert client.get("/v1/engine-version").status_code == 200
        assert client.get("/version").status_code == 404


def test_the_spec_plugin_must_come_last():
    from litestar import Litestar
    from litestar.plugins import InitPlugin

    from choir.plugins.spec import SpecPlugin

    class Late(InitPlugin):
        def on_app_init(self, app_config):
            return app_config

    with pytest.raises(ImproperlyConfiguredException, match="last plugin.*Late"):
        Litestar(plugins=[SpecPlugin(), Late()])


def test_the_parsers_names_are_checked_before_any_engine_starts_wherever_the_plugin_is_listed():
    """No plugin order to keep: the name check goes first among the lifespans, so no engine starts (nor needs
    stopping) when CHOIR_REASONING_PARSER names a parser vLLM lacks."""
    from litestar.config.app import AppConfig

    from choir.plugins.engine.config import EngineConfig
    from choir.plugins.engine.plugin import EnginePlugin
    from choir.plugins.parsers import ParsersPlugin

    config = EngineConfig(Settings(served_model_name="fake-model"))
    app_config = EnginePlugin(config).on_app_init(AppConfig())  # listed first, its lifespan added first
    parsers = ParsersPlugin("no-such-parser", None, config)
    parsers.on_app_init(app_config)
    assert app_config.lifespan == [parsers._names_known, config.lifespan]
