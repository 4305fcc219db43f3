"""CHOIR_API_SERVERS, --api-server-count, --headless and CHOIR_FANOUT_PLACEMENT: read, checked, and refused in
one line where they cannot work (no engine starts here)."""

import os
import subprocess
import sys

import pytest

from choir.core.settings import Settings, SettingsError
from choir.engine.vllm.args import engine_argv
from tests.integration.server import ROOT


def settings(tmp_path, **env) -> Settings:
    return Settings.from_env(env, env_file=tmp_path / "missing.env")


def test_one_api_process_by_default(tmp_path):
    s = settings(tmp_path)
    assert (s.api_servers, s.headless, s.fanout_placement) == (1, False, "pinned")


@pytest.mark.parametrize("env", [{"CHOIR_API_SERVERS": "3"}, {"CHOIR_ENGINE_ARGS": "--api-server-count 3"},
                                 {"CHOIR_ENGINE_ARGS": "-asc=3 --max-model-len 512"},
                                 {"CHOIR_API_SERVERS": "3", "CHOIR_ENGINE_ARGS": "--api-server-count 3"}])
def test_api_server_count_is_choirs_setting_or_vllms_flag(tmp_path, env):
    s = settings(tmp_path, **env)
    assert s.api_servers == 3
    assert not any("api-server" in arg or arg.startswith("-asc") for arg in engine_argv(s))  # not the engine's


def test_headless_is_taken_out_of_the_engine_flags(tmp_path):
    s = settings(tmp_path, CHOIR_ENGINE_ARGS="--headless --data-parallel-size 2")
    assert s.headless and "--headless" not in engine_argv(s) and "--data-parallel-size" in engine_argv(s)


@pytest.mark.parametrize("env, fragment", [
    ({"CHOIR_API_SERVERS": "0"}, "CHOIR_API_SERVERS='0' must be at least 1"),
    ({"CHOIR_API_SERVERS": "two"}, "CHOIR_API_SERVERS='two' is not an integer"),
    ({"CHOIR_ENGINE_ARGS": "--api-server-count two"}, "--api-server-count='two' is not an integer"),
    ({"CHOIR_ENGINE_ARGS": "--api-server-count"}, "--api-server-count needs a number"),
    ({"CHOIR_API_SERVERS": "2", "CHOIR_ENGINE_ARGS": "--api-server-count 3"}, "disagree"),
    ({"CHOIR_API_SERVERS": "2", "CHOIR_ALLOW_RUNTIME_LORA": "true"}, "CHOIR_ALLOW_RUNTIME_LORA=true needs"),
    ({"CHOIR_API_SERVERS": "2", "CHOIR_ENGINE_ARGS": "--headless"}, "CHOIR_API_SERVERS must be 1"),
    ({"CHOIR_FANOUT_PLACEMENT": "everywhere"}, "CHOIR_FANOUT_PLACEMENT"),
])
def test_bad_front_end_settings_are_one_clear_error(tmp_path, env, fragment):
    with pytest.raises(SettingsError, match=fragment.replace("(", r"\(")) as raised:
        settings(tmp_path, **env)
    assert "\n" not in str(raised.value)


def _run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *command], cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=180)


@pytest.mark.parametrize("env, fragment", [({"CHOIR_API_SERVERS": "2"}, "CHOIR_API_SERVERS=2 needs `choir-serve`"),
                                           ({"CHOIR_ENGINE_ARGS": "--headless"}, "--headless needs `choir-serve`")])
def test_one_process_runners_say_they_run_one(env, fragment):
    """uvicorn (or `litestar run`) builds the app in one process: N > 1 is the supervisor's job."""
    result = _run(["-m", "uvicorn", "--factory", "choir.app.asgi:create_app", "--port", "0"], env)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("choir:")]
    assert len(lines) == 1 and fragment in lines[0], result.stderr[-2000:]


BAD_SERVE_SETTINGS = [
    ({"CHOIR_API_SERVERS": "two"}, "CHOIR_API_SERVERS"),
    # What each worker would refuse, refused once by the supervisor.
    ({"CHOIR_API_SERVERS": "2", "CHOIR_COMPAT": "openai-ish"}, "CHOIR_COMPAT"),
    ({"CHOIR_API_SERVERS": "2", "CHOIR_TOOL_PARSER": "no-such-parser"}, "CHOIR_TOOL_PARSER"),
    # Flags vLLM's parser takes but its engine config refuses: before any engine process starts.
    ({"CHOIR_API_SERVERS": "2", "CHOIR_ENGINE_ARGS": "--data-parallel-size 2 --data-parallel-size-local 3"},
     "CHOIR_ENGINE_ARGS: the engine refuses these flags"),
    ({"CHOIR_API_SERVERS": "2", "CHOIR_ENGINE_ARGS": "--data-parallel-size 2 --data-parallel-rank 1"},
     "Non-MoE models do not support external data parallel mode"),
]


@pytest.mark.parametrize("env, fragment", BAD_SERVE_SETTINGS)
def test_choir_serve_with_a_bad_setting_stops_with_one_line(env, fragment, environ, capfd):
    """`choir serve`'s own code, in this process (the next test runs the command for one of them)."""
    from choir.cli.serve import main

    environ.update(env)
    with pytest.raises(SystemExit) as exited:
        main(["--port", "0"])
    assert exited.value.code == 2
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("choir:")]
    assert len(lines) == 1 and fragment in lines[0], err[-2000:]
    assert "Traceback" not in err


@pytest.mark.parametrize("env, fragment", BAD_SERVE_SETTINGS[:1])
def test_choir_serve_with_a_bad_setting_exits_with_one_line(env, fragment):
    result = _run(["-m", "choir.cli.serve", "--port", "0"], env)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("choir:")]
    assert len(lines) == 1 and fragment in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
