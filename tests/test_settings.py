"""Settings: environment and .env, defaults, and one clear line for every bad value."""

import re
import subprocess
import sys

import pytest

from core.settings import BUNDLED_MODEL_DIR, BUNDLED_MODEL_NAME, Settings, SettingsError
from tests.integration.server import ROOT


def settings(tmp_path, **env) -> Settings:
    return Settings.from_env(env, env_file=tmp_path / "missing.env")


def test_defaults_serve_the_bundled_model(tmp_path):
    s = settings(tmp_path)
    assert s.model == str(BUNDLED_MODEL_DIR) and s.served_model_name == BUNDLED_MODEL_NAME
    assert s.max_n == 128 and s.is_bundled_model
    argv = s.engine_argv(("--no-enable-chunked-prefill",))
    assert argv[:4] == ["--model", str(BUNDLED_MODEL_DIR), "--served-model-name", BUNDLED_MODEL_NAME]
    assert "--no-enable-chunked-prefill" in argv and "--max-model-len" in argv


def test_another_model_is_served_under_its_id(tmp_path):
    s = settings(tmp_path, CHOIR_MODEL="org/some-model")
    assert s.served_model_name == "org/some-model" and "--max-model-len" not in s.engine_argv()


def test_user_engine_args_come_last_and_replace_the_defaults(tmp_path):
    s = settings(tmp_path, CHOIR_ENGINE_ARGS="--max-model-len 512 --enable-chunked-prefill")
    argv = s.engine_argv(("--no-enable-chunked-prefill",))
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
    argv = settings(tmp_path, CHOIR_ENGINE_ARGS=user).engine_argv()
    assert [arg for i, arg in enumerate(argv) if arg.startswith("--structured-outputs-config")
            or (i and argv[i - 1].startswith("--structured-outputs-config") and not arg.startswith("--"))] == expected


def test_the_reasoning_parser_reaches_the_engine(tmp_path):
    argv = settings(tmp_path, CHOIR_REASONING_PARSER="qwen3").engine_argv()
    assert argv[argv.index("--reasoning-parser") + 1] == "qwen3"
    assert "--reasoning-parser" not in settings(tmp_path).engine_argv()


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
    from plugins.engine.vllm_engine import parse_engine_args

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
    from plugins.engine.vllm_engine import parse_engine_args

    with pytest.raises(SettingsError, match=fragment) as raised:
        parse_engine_args(settings(tmp_path, CHOIR_ENGINE_ARGS=flags), on_cpu=True)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("env", [{"CHOIR_MAX_N": "many"}, {"CHOIR_COMPAT": "openai-ish"},
                                 {"CHOIR_ENGINE_ARGS": "--no-such-flag"}, {"CHOIR_TOOL_PARSER": "no-such-parser"},
                                 {"CHOIR_REASONING_PARSER": "no-such-parser"},
                                 {"CHOIR_ENGINE_ARGS": "--data-parallel-size 2 --data-parallel-size-local 3"}])
def test_server_with_a_bad_setting_exits_with_one_line(env):
    """Both kinds: checked when the app is built, and when the engine's flags are parsed."""
    result = subprocess.run(
        [sys.executable, "-m", "uvicorn", "--factory", "app.asgi:create_app", "--port", "0"],
        cwd=ROOT, env={**__import__("os").environ, **env}, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("choir:")]
    assert len(lines) == 1 and list(env)[0] in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_several_served_names_are_aliases(tmp_path):
    s = settings(tmp_path, CHOIR_SERVED_MODEL_NAME="choir-tiny, tiny-alias")
    assert s.served_model_names == ("choir-tiny", "tiny-alias")
    argv = s.engine_argv()
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
    assert "--enable-lora" in s.engine_argv()
    assert "--enable-lora" not in settings(tmp_path).engine_argv()
    assert "--enable-lora" in settings(tmp_path, CHOIR_ALLOW_RUNTIME_LORA="true").engine_argv()


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


def test_the_embedding_engine_runs_vllms_pooling_runner(tmp_path):
    from core.settings import BUNDLED_EMBEDDING_DIR, BUNDLED_EMBEDDING_NAME

    assert settings(tmp_path).embedding_model is None  # no second engine unless asked
    s = settings(tmp_path, CHOIR_EMBEDDING_MODEL=str(BUNDLED_EMBEDDING_DIR),
                 CHOIR_EMBEDDING_ENGINE_ARGS="--max-model-len 256")
    assert s.embedding_model_names == (BUNDLED_EMBEDDING_NAME,)
    argv = s.embedding_engine_argv()
    assert argv[argv.index("--runner") + 1] == "pooling" and argv[-2:] == ["--max-model-len", "256"]
    assert argv.count("--max-model-len") == 1
    named = settings(tmp_path, CHOIR_EMBEDDING_MODEL="org/embedder", CHOIR_EMBEDDING_MODEL_NAME="e1,e2")
    assert named.embedding_model_names == ("e1", "e2")
    with pytest.raises(SettingsError, match="CHOIR_EMBEDDING_MODEL"):
        settings(tmp_path, CHOIR_EMBEDDING_MODEL="/no/such/dir")
    with pytest.raises(SettingsError, match="CHOIR_EMBEDDING_MODEL_NAME"):
        settings(tmp_path, CHOIR_EMBEDDING_MODEL="org/embedder", CHOIR_EMBEDDING_ENGINE_ARGS="--served-model-name x")


def test_two_engines_on_one_gpu_must_fit_together():
    """Checked before either engine starts on a GPU (on the CPU each has its own KV cache space)."""
    from plugins.engine.vllm_engine import check_gpu_share, parse_flags

    def parsed(*flags):
        return parse_flags(["--model", "m", *flags], "CHOIR_ENGINE_ARGS")

    with pytest.raises(SettingsError, match=r"\(0.92 and 0.92\)") as raised:
        check_gpu_share(parsed(), parsed())
    assert "\n" not in str(raised.value)
    check_gpu_share(parsed("--gpu-memory-utilization", "0.8"), parsed("--gpu-memory-utilization", "0.1"))
    check_gpu_share(parsed(), parsed("--kv-cache-memory-bytes", "1000000"))  # bytes: vLLM checks them itself
