"""A bad setting found in the lifespan is raised, not `os._exit`: what started stops, an in-process runner
(this test) gets the SettingsError, and a server prints one line (tests/test_settings.py runs that)."""

from contextlib import asynccontextmanager

import pytest
from litestar.testing import TestClient

from choir.app.asgi import create_app
from choir.core.settings import RoleModel, Settings, SettingsError
from tests.fakes import FakeEngine


def test_an_unknown_parser_name_raises_before_the_engine_starts():
    started = []

    @asynccontextmanager
    async def factory(settings, model):
        started.append(settings)
        yield FakeEngine()

    app = create_app(Settings(served_model_name="fake-model", tool_parser="no-such-parser"), engine_factory=factory)
    with pytest.raises(Exception) as raised, TestClient(app):
        pass
    assert "CHOIR_TOOL_PARSER" in str(_settings_error(raised.value)) and started == []


def test_an_engine_that_started_is_stopped_when_the_next_one_refuses_its_settings(capsys):
    events = []

    @asynccontextmanager
    async def generation(settings, model):
        events.append("generation started")
        try:
            yield FakeEngine()
        finally:
            events.append("generation stopped")

    @asynccontextmanager
    async def embedding(settings, model):
        raise SettingsError("CHOIR_EMBEDDING_ENGINE_ARGS: unrecognized arguments: --nope")
        yield

    app = create_app(Settings(served_model_name="fake-model", pooling=(RoleModel("embed", "/models/e"),)),
                     engine_factory=generation, factories={"embed": embedding})
    with pytest.raises(Exception) as raised, TestClient(app):
        pass
    assert "--nope" in str(_settings_error(raised.value))
    assert events == ["generation started", "generation stopped"]
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("choir:")]
    assert lines == ["choir: CHOIR_EMBEDDING_ENGINE_ARGS: unrecognized arguments: --nope"]


def test_other_start_up_failures_keep_their_traceback():
    @asynccontextmanager
    async def broken(settings, model):
        raise RuntimeError("not a setting")
        yield

    with pytest.raises(Exception) as raised, TestClient(create_app(Settings(), engine_factory=broken)):
        pass
    assert _settings_error(raised.value) is None


def _settings_error(exc: BaseException) -> BaseException | None:
    if isinstance(exc, SettingsError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        return next(filter(None, map(_settings_error, exc.exceptions)), None)
    return _settings_error(exc.__cause__) if exc.__cause__ else None
