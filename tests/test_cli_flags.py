"""`choir serve` takes `vllm serve`'s command line (choir/cli/flags.py): every option of vLLM's own parser is
mapped to a Choir setting, passed to the engine unchanged, or refused in one line; Choir's own settings have
flags; a flag wins over the environment."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from choir.cli import flags
from choir.core.settings import Settings, SettingsError
from choir.engine import backend
from choir.engine.vllm.args import parse_flags

# The command line of the issue, as a vLLM user writes it (the model a local one: Settings checks paths).
ISSUE = ["models/choir-tiny", "--served-model-name", "q", "--api-key", "k", "--enable-auto-tool-choice",
         "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3", "--max-model-len", "32768",
         "--tensor-parallel-size", "2"]


@pytest.fixture(scope="module")
def parser():
    return flags.parser()


def settings_of(argv, environ=None):
    return Settings.from_env(flags.read(argv, environ or {}).environ, env_file=None)


def test_every_option_of_vllms_parser_is_mapped_passed_on_or_refused(parser):
    engine = backend.engine_dests()
    kinds = {"engine": engine - flags.CHOIR_TAKES, "setting": set(flags.SETTINGS), "uvicorn": set(flags.UVICORN),
             "as is": set(flags.AS_IS), "refused": set(flags.REFUSED)}
    dests = {action.dest for action in parser._actions if action.dest != "help"}
    vllms = {dest for dest in dests if not dest.startswith("choir_")}
    unclassified = sorted(dest for dest in vllms if not any(dest in members for members in kinds.values()))
    assert not unclassified, f"vLLM options Choir neither maps, passes on nor refuses: {unclassified}"
    # Every front-end option of vLLM's server is one of Choir's kinds, and no table names an option vLLM lacks.
    assert backend.frontend_dests() <= set().union(*kinds.values())
    for kind in ("setting", "uvicorn", "as is", "refused"):
        assert kinds[kind] <= vllms, f"{kind}: {sorted(kinds[kind] - vllms)} are not vLLM's options"
    # An option is one kind only (an engine option Choir also reads, --log-level, is passed on too).
    front = [kinds[kind] for kind in ("uvicorn", "as is", "refused")]
    assert sum(len(k) for k in front) == len(set().union(*front))
    assert not (set().union(*front) & kinds["setting"])
    assert len([dest for dest in dests if dest.startswith("choir_")]) == len(flags.CHOIR_FLAGS)


def test_the_issues_command_line_is_one_word_away(parser):
    settings = settings_of(ISSUE)
    assert settings.model == "models/choir-tiny" and settings.served_model_names == ("q",)
    assert settings.api_keys == ("k",) and settings.tool_parser == "hermes" and settings.reasoning_parser == "qwen3"
    assert settings.engine_args == ("--max-model-len", "32768", "--tensor-parallel-size", "2")


def test_engine_options_reach_the_engine_as_vllm_reads_them(parser):
    """Whatever spelling: `=`, `_`, a short option, an abbreviation, a dotted JSON option, a list, a boolean's
    --no- form, a config file: the engine's parser reads from Choir's engine flags what vLLM's reads from the
    whole command line."""
    argv = ["models/choir-tiny", "--max_model_len=1024", "-tp", "1", "--max-num-seq", "8", "--port", "9001",
            "--compilation-config.mode", "0", "--no-enable-prefix-caching", "--api-key", "k1", "k2",
            "--hf-overrides", '{"rope_theta": 5}', "--override-generation-config", '{"temperature": 0.5}',
            "--enable-log-requests", "--seed", "-1", "--dtype=float32"]
    settings = settings_of(argv)
    ours = parse_flags(["--model", settings.model, *settings.engine_args], "test")
    from vllm.engine.arg_utils import AsyncEngineArgs

    values = parser.parse_args(argv)
    values.model = values.model_tag
    theirs = AsyncEngineArgs.from_cli_args(values)
    for field in dataclasses.fields(AsyncEngineArgs):
        assert getattr(ours, field.name) == getattr(theirs, field.name), field.name
    assert ours.max_model_len == 1024 and ours.max_num_seqs == 8 and ours.enable_prefix_caching is False
    assert ours.seed == -1 and ours.dtype == "float32" and ours.enable_log_requests is True


def test_a_config_file_is_read_as_vllm_reads_it(parser, tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("max-model-len: 512\napi-key: secret\nserved-model-name: tiny\n")
    settings = settings_of(["models/choir-tiny", "--config", str(config)])
    assert settings.engine_args == ("--max-model-len", "512") and settings.api_keys == ("secret",)
    assert settings.served_model_names == ("tiny",)


def test_front_end_options_set_choirs_settings(parser, tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    argv = ["models/choir-tiny", "--lora-modules", "a=/tmp", '{"name": "b", "path": "/tmp", "base_model_name": "x"}',
            "--served-model-name", "x", "y", "--return-tokens-as-token-ids", "--enable-force-include-usage",
            "--trust-request-mm-kwargs", "--chat-template", str(template), "--chat-template-content-format",
            "openai", "--default-chat-template-kwargs", '{"enable_thinking": false}', "--max-log-len", "20",
            "--allowed-origins", '["https://a.example"]', "--allow-credentials", "--api-server-count", "2",
            "--log-level", "WARNING", "--disable-fastapi-docs", "--disable-access-log-for-endpoints",
            "/health,/metrics"]
    settings = settings_of(argv)
    assert [(m.name, m.path, m.base_model_name) for m in settings.lora_modules] == [("a", "/tmp", None),
                                                                                ("b", "/tmp", "x")]
    assert settings.served_model_names == ("x", "y") and settings.api_servers == 2
    assert settings.return_tokens_as_token_ids and settings.force_include_usage and settings.trust_request_mm_kwargs
    assert settings.chat_template == str(template) and settings.chat_template_content_format == "openai"
    assert settings.default_chat_template_kwargs == {"enable_thinking": False} and settings.max_log_len == 20
    assert settings.allowed_origins == ("https://a.example",) and settings.allow_credentials
    assert settings.log_level == "warning" and settings.engine_args == ("--log-level", "WARNING")
    assert not settings.docs and settings.quiet_paths == ("/health", "/metrics")


def test_uvicorns_options_go_to_uvicorn(parser):
    command = flags.read(["--host", "127.0.0.1", "--port", "9", "--root-path", "/llm", "--uvicorn-log-level",
                          "warning", "--ssl-keyfile", "k.pem"], {})
    assert command.uvicorn == {"host": "127.0.0.1", "port": 9, "root_path": "/llm", "log_level": "warning",
                               "ssl_keyfile": "k.pem"}


def test_choirs_own_settings_have_flags(parser):
    settings = settings_of(["models/choir-tiny", "--compat", "vllm", "--no-store", "--max-n", "4",
                            "--fanout-placement", "spread", "--protect-docs", "--embedding-model",
                            "models/choir-tiny-embed", "--embedding-engine-args", "--max-model-len 256"])
    assert settings.compat == "vllm" and settings.store_url is None and settings.max_n == 4
    assert settings.fanout_placement == "spread" and settings.protect_docs
    embed = settings.role("embed")
    assert embed is not None and embed.engine_args == ("--max-model-len", "256")
    with pytest.raises(SettingsError, match="CHOIR_MAX_N='0' must be at least 1"):
        settings_of(["--max-n", "0"])


def test_a_flag_wins_over_the_environment(parser):
    environ = {"CHOIR_API_KEY": "from-env", "CHOIR_ENGINE_ARGS": "--max-model-len 100 --seed 3",
               "CHOIR_COMPAT": "vllm", "CHOIR_MAX_N": "9"}
    settings = settings_of(["models/choir-tiny", "--api-key", "from-flag", "--max-model-len", "200",
                            "--compat", "sglang"], environ)
    assert settings.api_keys == ("from-flag",) and settings.compat == "sglang" and settings.max_n == 9
    engine = parse_flags(["--model", settings.model, *settings.engine_args], "test")
    assert engine.max_model_len == 200 and engine.seed == 3  # the flag after CHOIR_ENGINE_ARGS: it wins
    assert settings_of([], environ).api_keys == ("from-env",)  # no flag: the environment's


@pytest.mark.parametrize(("argv", "says"), [
    (["--grpc"], "--grpc is not served by Choir: Choir serves HTTP only."),
    (["--tool-server", "demo"], "--tool-server is not served by Choir"),
    (["--trust-request-chat-template"], "--trust-request-chat-template is not served by Choir"),
    (["--h11-max-header-count", "10"], "--h11-max-header-count is not served by Choir"),
    (["--enable-auto-tool-choice"], "--enable-auto-tool-choice requires --tool-call-parser"),
    (["--chat-template", "no/such/template.jinja"], "chat template"),
])
def test_an_option_choir_cannot_honour_stops_start_up_naming_it(parser, argv, says):
    with pytest.raises(SettingsError, match=says.replace(".", r"\.") if "." in says else says):
        flags.read(argv, {})


def test_a_refused_option_at_vllms_default_is_no_refusal(parser):
    command = flags.read(["--no-enable-log-outputs", "--h11-max-header-count", "256", "--tool-strict-level",
                          "auto"], {})
    assert "CHOIR_ENGINE_ARGS" not in command.environ


def run_choir(*args, env=None):
    return subprocess.run([sys.executable, "-m", "choir", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def test_the_command_says_one_line_and_exits_2_for_a_refused_option():
    result = run_choir("serve", "models/choir-tiny", "--grpc")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == "choir: --grpc is not served by Choir: Choir serves HTTP only."


def test_an_unknown_option_is_vllms_usage_error(environ, capfd):
    from choir.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(["serve", "--no-such-option"])
    assert exited.value.code == 2 and "unrecognized arguments: --no-such-option" in capfd.readouterr().err


def test_help_shows_choirs_options_and_says_vllms_are_accepted():
    result = run_choir("serve", "--help")
    assert result.returncode == 0
    assert "Every `vllm serve` option is accepted" in result.stdout
    for flag, variable in flags.CHOIR_FLAGS:
        assert flag in result.stdout and variable in result.stdout
    assert "--tool-call-parser" in result.stdout and "--help=all" in result.stdout


def test_version_is_the_packages():
    from importlib.metadata import version

    result = run_choir("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"choir {version('choir')}"
    import choir

    assert choir.__version__ == version("choir")


def test_lora_modules_are_written_as_choirs_json():
    class Module:
        name, path, base_model_name = "a", "/p", None

    assert json.loads(flags.SETTINGS["lora_modules"][1]([Module()])) == [{"name": "a", "path": "/p",
                                                                          "base_model_name": None}]


def test_litestar_run_finds_the_app_as_the_env_example_names_it(tmp_path):
    """`litestar run` finds the app through LITESTAR_APP, which .env.example sets (`litestar routes` builds the
    same app without starting the engine)."""
    from pathlib import Path

    from choir.core.settings import BUNDLED_MODEL_DIR

    example = (Path(__file__).resolve().parents[1] / ".env.example").read_text().splitlines()
    app = next(line.split("=", 1)[1] for line in example if line.startswith("LITESTAR_APP="))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("CHOIR_", "LITESTAR_"))}
    result = subprocess.run([str(Path(sys.executable).parent / "litestar"), "routes"], cwd=tmp_path, timeout=120,
                            env={**env, "LITESTAR_APP": app, "CHOIR_MODEL": str(BUNDLED_MODEL_DIR)},
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "/v1/chat/completions" in result.stdout and "/v1/messages" in result.stdout


PLUGIN = '''
from vllm.tool_parsers import ToolParser, ToolParserManager


@ToolParserManager.register_module("choir-test-parser")
class ChoirTestParser(ToolParser):
    pass
'''


def test_a_tool_parser_plugin_registers_its_parser(parser, tmp_path):
    """vLLM's --tool-parser-plugin: the file is imported before the parser's name is looked up (in each API
    process: the parsers plugin's check imports it there)."""
    plugin = tmp_path / "my_parsers.py"
    plugin.write_text(PLUGIN)
    settings = settings_of(["models/choir-tiny", "--enable-auto-tool-choice", "--tool-call-parser",
                            "choir-test-parser", "--tool-parser-plugin", str(plugin)])
    assert settings.tool_parser_plugin == str(plugin) and settings.parser_plugins == (str(plugin),)
    backend.check_parser_names(None, settings.tool_parser, settings.parser_plugins)
    from choir.engine.vllm.parsers import parser_classes

    assert parser_classes(None, "choir-test-parser")[1].__name__ == "ChoirTestParser"


def test_a_parser_plugin_that_is_not_a_file_is_one_line(parser, tmp_path):
    with pytest.raises(SettingsError, match="CHOIR_TOOL_PARSER_PLUGIN='.*nothing.py' is not a file"):
        settings_of(["--tool-parser-plugin", str(tmp_path / "nothing.py")])
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('broken plugin')\n")
    with pytest.raises(SettingsError, match="cannot be imported: broken plugin"):
        backend.check_parser_names(None, "hermes", (str(broken),))


def test_the_reasoning_parser_plugin_reaches_the_engine_from_choirs_setting(parser, tmp_path):
    from choir.engine.vllm.args import engine_argv

    plugin = tmp_path / "reasoning.py"
    plugin.write_text("")
    settings = settings_of(["models/choir-tiny", "--reasoning-parser-plugin", str(plugin)])
    assert "--reasoning-parser-plugin" not in settings.engine_args  # Choir's setting, not a pass-through
    argv = engine_argv(settings)
    assert argv[argv.index("--reasoning-parser-plugin") + 1] == str(plugin)


def test_the_positional_model_wins_over_model_as_on_vllm(parser):
    for _ in range(3):
        assert flags.read(["models/a", "--model", "models/b"], {}).environ["CHOIR_MODEL"] == "models/a"
    assert flags.read(["--model", "models/b"], {}).environ["CHOIR_MODEL"] == "models/b"


def test_vllms_other_log_levels_and_log_lengths(parser):
    assert flags.read(["--log-level", "CRITICAL"], {}).environ["CHOIR_LOG_LEVEL"] == "error"
    assert flags.read(["--log-level", "NOTSET"], {}).environ["CHOIR_LOG_LEVEL"] == "debug"
    assert settings_of(["models/choir-tiny", "--max-log-len", "0"]).max_log_len == 0
    with pytest.raises(SettingsError, match="CHOIR_MAX_LOG_LEN='-1' is not a number"):
        Settings.from_env({"CHOIR_MAX_LOG_LEN": "-1"}, env_file=None)


def test_a_config_file_that_cannot_be_read_is_one_line(parser, tmp_path):
    with pytest.raises(SettingsError, match="the command line cannot be read"):
        flags.read(["--config", str(tmp_path / "missing.yaml")], {})


def test_env_file_values_are_under_the_flags_not_lost(parser, tmp_path):
    """choir serve reads .env before its flags: a flag adds to .env's engine flags and wins over its values."""
    from choir.core.settings import environment

    (tmp_path / ".env").write_text("CHOIR_ENGINE_ARGS=--seed 3\nCHOIR_TOOL_PARSER=hermes\nCHOIR_COMPAT=vllm\n")
    env = environment({}, tmp_path / ".env")
    command = flags.read(["models/choir-tiny", "--max-model-len", "200", "--enable-auto-tool-choice", "--compat",
                          "sglang"], env)
    settings = Settings.from_env(command.environ, env_file=tmp_path / "none")
    assert settings.engine_args == ("--seed", "3", "--max-model-len", "200")
    assert settings.tool_parser == "hermes" and settings.compat == "sglang"


def test_vllms_api_key_variable_protects_the_server():
    """A `vllm serve` deployment keeping its key in VLLM_API_KEY stays protected on Choir; CHOIR_API_KEY wins."""
    assert Settings.from_env({"VLLM_API_KEY": "v1"}, env_file=None).api_keys == ("v1",)
    assert Settings.from_env({"VLLM_API_KEY": "v1", "CHOIR_API_KEY": "c1"}, env_file=None).api_keys == ("c1",)
