"""The compat rules below HTTP: profiles decode into typed rules (a typo stops start-up, naming the file
and key), `extends` merges rule by rule, and each kind of rule does what it says."""

import re

import pytest

from choir.core.compat import CompatProfile, OperationCompat, Rules, UnknownModel
from choir.core.errors import APIError
from choir.core.protocol.chat import ChatCompletionRequest
from choir.core.settings import SettingsError
from choir.plugins.spec import SPEC_DIR
from tests.spec_copy import spec_copy


def profiles_with(tmp_path, text: str, name: str = "typo"):
    spec_dir = spec_copy(tmp_path)
    (spec_dir / "profiles" / f"{name}.yaml").write_text(text)
    return spec_dir / "profiles"


@pytest.mark.parametrize("text, key", [
    ("rules:\n  greedy_n: rejct\n", "rules.greedy_n"),
    ("rules:\n  delta_always: {bogus: null}\n", "rules.delta_always"),
    ("rules:\n  delta_always: {tool_calls: oops}\n", "rules.delta_always"),  # a list on the wire: never always
    ("rules:\n  delta_always: {content: [1]}\n", "rules.delta_always"),
    ("rules:\n  unknown_model: {status: 404, message: 'no {modle}'}\n", "rules.unknown_model"),
    ("rules:\n  system_fingerprint: sometimes\n", "rules.system_fingerprint"),
    ("rules:\n  unknown_model: {status: 200, message: x}\n", "rules.unknown_model.status"),
    ("rules:\n  unknown_model: {message: x}\n", "rules.unknown_model"),
    ("rules:\n  no_such_rule: 1\n", "rules"),
    ("rulez: {}\n", "the document"),
    ("extends: sglang\nrules:\n  reasoning_field: thoughts\n", "rules.reasoning_field"),
])
def test_a_typo_in_a_profile_is_one_line_naming_the_file_and_key(tmp_path, text, key):
    profiles = profiles_with(tmp_path, text)
    with pytest.raises(SettingsError) as raised:
        CompatProfile.load(profiles, "typo")
    message = str(raised.value)
    assert "typo.yaml" in message and key in message and "\n" not in message


def test_an_app_with_a_bad_profile_does_not_start(tmp_path):
    """Start-up, not the first request, finds it (it used to turn every chat stream into a 400)."""
    from choir.app.asgi import create_app
    from choir.core.settings import Settings
    from choir.plugins.spec import SpecConfig

    profiles = profiles_with(tmp_path, "extends: sglang\nrules:\n  greedy_n: rejct\n")
    with pytest.raises(SystemExit) as raised:
        create_app(Settings(), spec=SpecConfig(profiles.parent, "typo"))
    [line] = str(raised.value).splitlines()
    assert line.startswith("choir: ") and "typo.yaml" in line and "rules.greedy_n" in line


@pytest.mark.parametrize("rules, says", [("[greedy_n, greedy_nn]", "greedy_nn"),
                                          ("[greedy_n, removed_fields]", "removed_fields")])
def test_an_operation_listing_a_rule_the_profile_lacks_does_not_start(tmp_path, rules, says):
    """A typo in `x-choir-rules`, or a rule the profile (with what it extends) does not set: one line
    naming the spec file, the operation and the rule."""
    from choir.app.asgi import create_app
    from choir.core.settings import Settings
    from choir.plugins.spec import SpecConfig

    profiles = profiles_with(tmp_path, "rules:\n  greedy_n: allow\n  model_root: path\n", "bare")  # /v1/models'
    spec = profiles.parent / "openapi.yaml"
    text, count = re.subn(r"operationId: createCompletion\n      x-choir-rules:\n(      - \w+\n)+",
                          f"operationId: createCompletion\n      x-choir-rules: {rules}\n", spec.read_text())
    assert count == 1
    spec.write_text(text)
    with pytest.raises(SystemExit) as raised:
        create_app(Settings(), spec=SpecConfig(profiles.parent, "bare"))
    [line] = str(raised.value).splitlines()
    assert "openapi.yaml" in line and "createCompletion" in line and says in line


def test_extends_merges_rule_by_rule(tmp_path):
    profiles = profiles_with(tmp_path, "extends: vllm\nrules:\n  greedy_n: allow\n", "mine")
    rules = CompatProfile.load(profiles, "mine").rules
    assert rules.greedy_n == "allow"  # its own
    assert rules.system_fingerprint == "include" and rules.reasoning_field == "reasoning"  # vllm's
    assert rules.removed_fields and "guided_json" in rules.removed_fields  # sglang's, through vllm


def test_an_operation_gets_only_the_rules_it_lists():
    profile = CompatProfile.load(SPEC_DIR / "profiles", "sglang")
    compat = profile.for_operation(["greedy_n"])
    assert compat.rules.greedy_n == "allow" and compat.rules.unknown_model is None
    compat.check_model("anything", ("served",))  # unknown_model is not this operation's rule
    with pytest.raises(SettingsError, match="no_such_rule"):
        profile.for_operation(["no_such_rule"])


def test_each_kind_of_rule():
    compat = OperationCompat(Rules(unknown_model=UnknownModel(status=404, message="no `{model}`; only {served}"),
                                   greedy_n="reject", rejected_fields={"functions": "use tools"},
                                   unknown_fields="reject", system_fingerprint="include",
                                   delta_always={"reasoning_content": None}, reasoning_field="reasoning"))
    with pytest.raises(APIError) as raised:
        compat.check_model("gpt-4", ("a", "b"))
    assert (raised.value.status, raised.value.message, raised.value.param) == (404, "no `gpt-4`; only a, b", "model")
    with pytest.raises(APIError, match="greedy"):
        compat.check_n(2, 0.0)
    compat.check_n(2, 0.7)
    with pytest.raises(APIError, match="use tools"):
        compat.check_body({"messages": [], "functions": []}, ChatCompletionRequest)
    with pytest.raises(APIError) as unknown:
        compat.check_body({"messages": [], "frobnicate": 1}, ChatCompletionRequest)
    assert unknown.value.param == "frobnicate"
    assert compat.system_fingerprint("vllm", "0.32.0", "/m", 2048).startswith("vllm-0.32.0-")
    delta = compat.delta({"role": "assistant"}, content="hi", reasoning="why")
    assert (delta.role, delta.content, delta.reasoning, delta.reasoning_content) == ("assistant", "hi", "why", None)
    message = compat.message("answer", [], "thought", reads_reasoning=True)
    assert message.reasoning == "thought" and message.content == "answer"


def test_no_rules_apply_nothing():
    compat = OperationCompat()
    compat.check_model("x", ())
    compat.check_n(4, 0.0)
    compat.check_body({"frobnicate": 1}, ChatCompletionRequest)
    assert compat.system_fingerprint("vllm", "v", "/m", 1) is None and compat.delta({}).content is msgspec_unset()


def msgspec_unset():
    from msgspec import UNSET

    return UNSET
