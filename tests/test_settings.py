"""Settings: environment and .env, defaults, and one clear line for every bad value."""

import re
import subprocess
import sys

import pytest

from choir.core.settings import BUNDLED_MODEL_DIR, BUNDLED_MODEL_NAME, Settings, SettingsError
from choir.engine.vllm.args import engine_argv
from tests.integration.server import ROOT


def settings(tmp_path, **env) -> Settings:
    return Settings.from_env(env, env_file=tmp_path / "missing.env")


def test_defaults_serve_the_bundled_model(tmp_path):
    s = settings(tmp_path)
    assert s.model == str(BUNDLED_MODEL_DIR) and s.served_model_name == BUNDLED_MODEL_NAME
    assert s.max_n == 128 and s.is_bundled_model
    argv = engine_argv(s, on_cpu=True)
    assert argv[:4] == ["--model", str(BUNDLED_MODEL_DIR), "--served-model-name", BUNDLED_MODEL_NAME]
    assert "--no-enable-chunked-prefill" in argv and "--max-model-len" in argv


def test_another_model_is_served_under_its_id(tmp_path):
    s = settings(tmp_path, CHOIR_MODEL="org/some-model")
    assert s.served_model_name == "org/some-model" and "--max-model-len" not in engine_argv(s)


def test_user_engine_args_come_last_and_replace_the_defaults(tmp_path):
    s = settings(tmp_path, CHOIR_ENGINE_ARGS="--max-model-len 512 --enable-chunked-prefill")
    argv = engine_argv(s, on_cpu=True)
    assert argv[-3:] == ["--max-model-len", "512", "--enable-chunked-prefill"]
    # Choir's own values of those flags are left out: vLLM would warn of duplicate keys.
    assert argv.count("--max-model-len") == 1 and "--no-enable-chunked-prefill" not in argv
    assert "--enforce-eager" in argv and argv[argv.index("--max-num-seqs") + 1] == "128"


@pytest.mark.parametrize("user, expected", [
    ("", ["--structured-outputs-config.backend", "xgrammar", "--structured-outputs-config.disable_any_whitespace",
          "true"]),
    ("--structured-outputs-config.backend guidance", ["--structured-outputs-config.backend", "guidance"]),
    ("--structured-outputs-config.disable_any_whitespace=false", ["--structured-outputs-config.disable_any_whitespace"
                                                                  "=false"]),
    ("--structured-outputs-config '{\"backend\":\"outlines\"}'",
     ["--structured-outputs-config", '{"backend":"outlines"}']),
])
def test_structured_outputs_bound_whitespace_unless_the_user_configures_them(tmp_path, user, expected):
    argv = engine_argv(settings(tmp_path, CHOIR_ENGINE_ARGS=user))
    assert [arg for i, arg in enumerate(argv) if arg.startswith("--structured-outputs-config")
            or (i and argv[i - 1].startswith("--structured-outputs-config") and not arg.startswith("--"))] == expected


def test_the_reasoning_parser_reaches_the_engine(tmp_path):
    argv = engine_argv(settings(tmp_path, CHOIR_REASONING_PARSER="qwen3"))
    assert argv[argv.index("--reasoning-parser") + 1] == "qwen3"
    assert "--reasoning-parser" not in engine_argv(settings(tmp_path))


def test_env_file_is_read_and_the_environment_wins(tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text("CHOIR_SERVED_MODEL_NAME=from-file\nCHOIR_MAX_N=7\n")
    s = Settings.from_env({"CHOIR_MAX_N": "9"}, env_file=env_file)
    assert s.served_model_name == "from-file" and s.max_n == 9


@pytest.mark.parametrize("env, fragment", [
    ({"CHOIR_MODEL": "/no/such/dir"}, "CHOIR_MODEL"),
    ({"CHOIR_MAX_N": "many"}, "CHOIR_MAX_N"),
    ({"CHOIR_MAX_N": "0"}, "CHOIR_MAX_N"),
    ({"CHOIR_LOG_LEVEL": "loud"}, "CHOIR_LOG_LEVEL"),
    ({"CHOIR_ENGINE_ARGS": "--max-model-len '512"}, "CHOIR_ENGINE_ARGS"),
    ({"CHOIR_ENGINE_ARGS": "--model x"}, "CHOIR_MODEL"),
    ({"CHOIR_ENGINE_ARGS": "--reasoning-parser qwen3"}, "CHOIR_REASONING_PARSER"),
])
def test_bad_settings_are_one_clear_error(tmp_path, env, fragment):
    with pytest.raises(SettingsError, match=fragment) as raised:
        settings(tmp_path, **env)
    assert "\n" not in str(raised.value)


def test_engine_args_go_through_vllms_own_parser(tmp_path):
    from choir.engine.vllm.args import parse_engine_args

    args = parse_engine_args(settings(tmp_path, CHOIR_ENGINE_ARGS="--max-model-len 512 --max-logprobs 5"),
                             on_cpu=True)
    assert args.max_model_len == 512 and args.max_logprobs == 5 and args.enable_chunked_prefill is False
    assert args.served_model_name == [BUNDLED_MODEL_NAME]
    flags = "--structured-outputs-config.backend xgrammar --structured-outputs-config.disable_any_whitespace true"
    dotted = parse_engine_args(settings(tmp_path, CHOIR_ENGINE_ARGS=flags), on_cpu=True)
    assert dotted.structured_outputs_config.disable_any_whitespace is True  # vLLM's dotted flags work


@pytest.mark.parametrize("flags, fragment", [("--no-such-flag", "--no-such-flag"),
                                             ("--max-model-len lots", "max-model-len")])
def test_bad_engine_args_are_one_clear_error(tmp_path, flags, fragment):
    from choir.engine.vllm.args import parse_engine_args

    with pytest.raises(SettingsError, match=fragment) as raised:
        parse_engine_args(settings(tmp_path, CHOIR_ENGINE_ARGS=flags), on_cpu=True)
    assert "\n" not in str(raised.value)


BAD_SERVER_SETTINGS = [{"CHOIR_MAX_N": "many"}, {"CHOIR_COMPAT": "openai-ish"},
                       {"CHOIR_ENGINE_ARGS": "--no-such-flag"}, {"CHOIR_TOOL_PARSER": "no-such-parser"},
                       {"CHOIR_REASONING_PARSER": "no-such-parser"},
                       {"CHOIR_ENGINE_ARGS": "--data-parallel-size 2 --data-parallel-size-local 3"}]


@pytest.mark.parametrize("env", BAD_SERVER_SETTINGS)
def test_the_app_with_a_bad_setting_stops_starting_with_one_line(env, environ, capfd):
    """Both kinds, in this process: checked when the app is built (SystemExit with the line), and when the lifespan
    parses the engine's flags (the line printed once, the start-up failed). The next test shows what a real server
    process does with one of each."""
    from litestar.testing import TestClient

    from choir.app.asgi import create_app

    environ.update(env)
    try:
        app = create_app()
    except SystemExit as exc:
        lines = [str(exc.code)]
    else:
        with pytest.raises(BaseException) as raised:
            with TestClient(app):
                pass
        assert raised.type is SettingsError or raised.group_contains(SettingsError), raised.value
        lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("choir:")]
    assert len(lines) == 1 and lines[0].startswith(f"choir: {list(env)[0]}"), lines


@pytest.mark.parametrize("env", [BAD_SERVER_SETTINGS[0], BAD_SERVER_SETTINGS[2]])
def test_server_with_a_bad_setting_exits_with_one_line(env):
    result = subprocess.run(
        [sys.executable, "-m", "uvicorn", "--factory", "choir.app.asgi:create_app", "--port", "0"],
        cwd=ROOT, env={**__import__("os").environ, **env}, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("choir:")]
    assert len(lines) == 1 and list(env)[0] in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_several_served_names_are_aliases(tmp_path):
    s = settings(tmp_path, CHOIR_SERVED_MODEL_NAME="choir-tiny, tiny-alias")
    assert s.served_model_names == ("choir-tiny", "tiny-alias")
    argv = engine_argv(s)
    assert argv[argv.index("--served-model-name") + 1: argv.index("--served-model-name") + 3] == \
        ["choir-tiny", "tiny-alias"]


@pytest.mark.parametrize("raw, expected", [
    ("a=models/choir-tiny, b=org/hub-adapter", [("a", "models/choir-tiny"), ("b", "org/hub-adapter")]),
    ('[{"name": "a", "path": "org/x"}]', [("a", "org/x", None)]),
    ('{"name": "a", "path": "org/x", "base_model_name": "choir-tiny"}', [("a", "org/x", "choir-tiny")]),
])
def test_lora_modules_take_vllms_forms_and_enable_lora(tmp_path, raw, expected):
    s = settings(tmp_path, CHOIR_LORA_MODULES=raw)
    assert [(m.name, m.path, m.base_model_name) for m in s.lora_modules] == \
        [entry if len(entry) == 3 else (*entry, None) for entry in expected]
    assert "--enable-lora" in engine_argv(s)
    assert "--enable-lora" not in engine_argv(settings(tmp_path))
    assert "--enable-lora" in engine_argv(settings(tmp_path, CHOIR_ALLOW_RUNTIME_LORA="true"))


@pytest.mark.parametrize("raw, fragment", [
    ("novalue", "name=path"), ("a=/no/such/dir", "not a directory"), ("a=org/x,a=org/y", "twice"),
    ('[{"name": 1}]', "JSON"), ('{"name": 1, "path": "org/x"}', "JSON"),
    ('{"name": "a", "path": "x", "rank": 8}', "JSON"),
    ('{"name": "a", "path": "org/x", "base_model_name": "other"}', "not a served name"),
    ("choir-tiny=org/x", "CHOIR_SERVED_MODEL_NAME too")])
def test_bad_lora_modules_are_one_clear_error(tmp_path, raw, fragment):
    with pytest.raises(SettingsError, match=fragment) as raised:
        settings(tmp_path, CHOIR_LORA_MODULES=raw)
    assert "CHOIR_LORA_MODULES" in str(raised.value)


@pytest.mark.parametrize("env, fragment", [
    ({"CHOIR_SERVED_MODEL_NAME": " , "}, "names no model"),
    ({"CHOIR_SERVED_MODEL_NAME": "a,b,a"}, "`a` twice"),
    ({"CHOIR_MODEL": "org/m", "CHOIR_EMBEDDING_MODEL": "org/m"}, "CHOIR_EMBEDDING_MODEL_NAME names `org/m` in "
                                                                 "CHOIR_SERVED_MODEL_NAME too"),
    ({"CHOIR_EMBEDDING_MODEL": "org/e", "CHOIR_EMBEDDING_MODEL_NAME": "choir-tiny"}, "CHOIR_SERVED_MODEL_NAME too"),
    ({"CHOIR_EMBEDDING_MODEL": "org/e", "CHOIR_EMBEDDING_MODEL_NAME": ","}, "names no model"),
    ({"CHOIR_EMBEDDING_MODEL": "org/e", "CHOIR_LORA_MODULES": "org/e=org/adapter"}, "CHOIR_EMBEDDING_MODEL_NAME too"),
    ({"CHOIR_EMBEDDING_MODEL_NAME": "e"}, "need CHOIR_EMBEDDING_MODEL"),
    ({"CHOIR_EMBEDDING_ENGINE_ARGS": "--max-model-len 64"}, "need CHOIR_EMBEDDING_MODEL"),
])
def test_every_model_name_means_one_model(tmp_path, env, fragment):
    with pytest.raises(SettingsError, match=re.escape(fragment)) as raised:
        settings(tmp_path, **env)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("prefix, role", [("EMBEDDING", "embed"), ("RERANK", "rerank"), ("CLASSIFY", "classify")])
def test_each_pooling_role_has_the_same_three_settings_and_runs_vllms_pooling_runner(tmp_path, prefix, role):
    from choir.core.settings import POOLING_ROLES
    from choir.engine.vllm.args import pooling_argv

    assert settings(tmp_path).pooling == ()  # no pooling engine unless asked
    bundled = next(r for r in POOLING_ROLES if r.role == role)
    s = settings(tmp_path, **{f"CHOIR_{prefix}_MODEL": str(bundled.bundled_dir),
                              f"CHOIR_{prefix}_ENGINE_ARGS": "--max-model-len 256"})
    model = s.role(role)
    assert model is not None and s.models == (s.generation, model)
    assert model.served_model_names == (bundled.bundled_name,)
    argv = pooling_argv(model)
    assert argv[argv.index("--runner") + 1] == "pooling" and "--max-model-len" in argv[-3:]
    assert argv.count("--max-model-len") == 1 and "--disable-log-stats" in argv
    named = settings(tmp_path, **{f"CHOIR_{prefix}_MODEL": "org/model", f"CHOIR_{prefix}_MODEL_NAME": "e1,e2"})
    assert named.role(role).served_model_names == ("e1", "e2")
    with pytest.raises(SettingsError, match=f"CHOIR_{prefix}_MODEL="):
        settings(tmp_path, **{f"CHOIR_{prefix}_MODEL": "/no/such/dir"})
    with pytest.raises(SettingsError, match=f"CHOIR_{prefix}_MODEL_NAME"):
        settings(tmp_path, **{f"CHOIR_{prefix}_MODEL": "org/model",
                              f"CHOIR_{prefix}_ENGINE_ARGS": "--served-model-name x"})
    with pytest.raises(SettingsError, match=f"need CHOIR_{prefix}_MODEL"):
        settings(tmp_path, **{f"CHOIR_{prefix}_MODEL_NAME": "x"})


def test_engines_on_one_gpu_must_fit_together(tmp_path):
    """Checked before any engine starts on a GPU (on the CPU each has its own KV cache space)."""
    from choir.engine.vllm.args import check_gpu_share

    def two(generation: str = "", rerank: str = "", classify: str | None = None):
        env = {"CHOIR_MODEL": "org/m", "CHOIR_ENGINE_ARGS": generation, "CHOIR_RERANK_MODEL": "org/r",
               "CHOIR_RERANK_ENGINE_ARGS": rerank}
        if classify is not None:
            env |= {"CHOIR_CLASSIFY_MODEL": "org/c", "CHOIR_CLASSIFY_ENGINE_ARGS": classify}
        return settings(tmp_path, **env)

    with pytest.raises(SettingsError, match=r"CHOIR_ENGINE_ARGS 0.92, CHOIR_RERANK_ENGINE_ARGS 0.92") as raised:
        check_gpu_share(two())
    assert "\n" not in str(raised.value)
    check_gpu_share(two("--gpu-memory-utilization 0.8", "--gpu-memory-utilization 0.1"))
    check_gpu_share(two(rerank="--kv-cache-memory-bytes 1000000"))  # bytes: vLLM checks them itself
    with pytest.raises(SettingsError, match="CHOIR_CLASSIFY_ENGINE_ARGS 0.1"):  # a third role counts too
        check_gpu_share(two("--gpu-memory-utilization 0.8", "--gpu-memory-utilization 0.1",
                            "--gpu-memory-utilization 0.1"))
    check_gpu_share(settings(tmp_path))  # one engine: nothing to share


def test_the_response_store_settings(tmp_path):
    from choir.core.settings import DEFAULT_STORE_TTL, DEFAULT_STORE_URL

    s = settings(tmp_path)
    assert s.store_url == DEFAULT_STORE_URL and DEFAULT_STORE_URL.startswith("sqlite+aiosqlite:////")
    assert s.store_ttl == DEFAULT_STORE_TTL
    assert settings(tmp_path, CHOIR_STORE="off").store_url is None
    assert settings(tmp_path, CHOIR_STORE_TTL="0").store_ttl is None  # until deleted
    url = "postgresql+asyncpg://choir@127.0.0.1/choir"
    assert settings(tmp_path, CHOIR_STORE_URL=url).store_url == url
    assert Settings().store_url is None  # built in code (tests, benchmarks): no store unless given
    for env, fragment in [({"CHOIR_STORE_URL": "sqlite:///x.db"}, "CHOIR_STORE_URL"),
                          ({"CHOIR_STORE_TTL": "soon"}, "CHOIR_STORE_TTL"),
                          ({"CHOIR_STORE_TTL": "-1"}, "CHOIR_STORE_TTL"),
                          ({"CHOIR_STORE": "maybe"}, "CHOIR_STORE")]:
        with pytest.raises(SettingsError, match=fragment) as raised:
            settings(tmp_path, **env)
        assert "\n" not in str(raised.value)
