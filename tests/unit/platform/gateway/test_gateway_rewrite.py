"""Strategy → body rewrite, strategy refusals, and settings parsing."""

from __future__ import annotations

import json

import pytest

from ablab.platform.gateway.rewrite import (
    BUILTIN_TEMPLATES,
    StrategyError,
    apply_strategy,
    cot_instruction,
    strategy_problems,
)
from ablab.platform.gateway.settings import GatewayConfigError, load_settings, parse_config

BODY = {"model": "m", "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "2+2?"}],
        "vendor_field": {"x": [1, 2]}, "temperature": 0.9}


def test_empty_strategy_returns_the_same_body() -> None:
    assert apply_strategy(BODY, {}, chat=True, templates={}) is BODY


def test_only_the_fields_a_strategy_sets_change() -> None:
    out = apply_strategy(BODY, {"model": "big", "params": {"temperature": 0.2, "top_p": 0.5}}, chat=True, templates={})
    assert out["model"] == "big" and out["temperature"] == 0.2 and out["top_p"] == 0.5
    assert out["vendor_field"] == BODY["vendor_field"] and out["messages"] == BODY["messages"]
    assert BODY["temperature"] == 0.9  # the caller's body is not mutated


def test_system_prompt_replaces_or_inserts_and_cot_appends() -> None:
    out = apply_strategy(BODY, {"system_prompt": "Be brief."}, chat=True, templates={})
    assert out["messages"][0] == {"role": "system", "content": "Be brief."} and len(out["messages"]) == 2
    no_sys = {**BODY, "messages": [{"role": "user", "content": "hi"}]}
    out = apply_strategy(no_sys, {"system_prompt": "S", "cot_depth": 3}, chat=True, templates={})
    assert out["messages"][0] == {"role": "system", "content": f"S\n\n{cot_instruction(3)}"}
    out = apply_strategy(BODY, {"cot_depth": 2}, chat=True, templates={})
    assert out["messages"][0]["content"] == f"sys\n\n{cot_instruction(2)}"


def test_templates_render_around_the_last_user_message() -> None:
    body = {"messages": [{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"},
                         {"role": "user", "content": [{"type": "text", "text": "second"}]}]}
    out = apply_strategy(body, {"prompt_template": "wrap"}, chat=True, templates={"wrap": "<<{input}>>"})
    assert out["messages"][0]["content"] == "first"
    assert out["messages"][2]["content"] == [{"type": "text", "text": "<<second>>"}]
    out = apply_strategy({"prompt": "p"}, {"prompt_template": "structured", "system_prompt": "S"}, chat=False, templates={})
    assert out["prompt"] == "S\n\n" + BUILTIN_TEMPLATES["structured"].replace("{input}", "p")


def test_compression_uses_the_given_scorer_and_refuses_without_one() -> None:
    strategy = {"compression": {"method": "entropy", "tau": 0.3, "window": 8}}
    seen = []
    out = apply_strategy(BODY, strategy, chat=True, templates={}, compress=lambda t, tau, w: seen.append((tau, w)) or t[:2])
    assert out["messages"][1]["content"] == "2+" and seen == [(0.3, 8)]
    with pytest.raises(StrategyError, match="torch"):
        apply_strategy(BODY, strategy, chat=True, templates={})


def test_strategy_problems_name_the_factor() -> None:
    problems = strategy_problems({"backend": "nope", "prompt_template": "zzz", "cot_depth": 99, "params": {"stream": True}},
                                 backends={"a": 1}, templates={})
    text = " ".join(problems)
    for name in ("backend='nope'", "prompt_template='zzz'", "cot_depth=99", "params: ['stream']"):
        assert name in text
    assert strategy_problems({"backend": "a", "params": {"temperature": 1}}, backends={"a": 1}, templates={}) == []


def test_settings_from_env_json_and_yaml(tmp_path) -> None:
    env = {"ABLAB_GATEWAY_BACKENDS": json.dumps({"a": {"url": "http://h:1/v1"}, "b": {"url": "http://h:2/v1/", "default": True, "kind": "vllm"}})}
    s = load_settings(env=env)
    assert s.default_backend == "b" and s.backends["b"].url == "http://h:2/v1" and s.backends["b"].kind == "vllm"
    cfg = tmp_path / "g.yaml"
    cfg.write_text("backends:\n  x: {url: 'http://h:3/v1', price: {device: cpu}}\n  y: {url: 'http://h:4/v1'}\n"
                   "default_backend: y\ntemplates:\n  t: 'Q: {input}'\n")
    s = load_settings(config_file=cfg, env={})
    assert s.default_backend == "y" and s.backends["x"].price.device == "cpu" and s.templates == {"t": "Q: {input}"}


@pytest.mark.parametrize("data, message", [
    ({"a": {"url": "ftp://x"}}, "backends.a.url"),
    ({"a": {"url": "http://x", "kind": "tgi2"}}, "backends.a.kind"),
    ({"a": {"url": "http://x", "timeout_s": 0}}, "backends.a.timeout_s"),
    ({"a": {"url": "http://x", "colour": 1}}, "unknown field"),
    ({"backends": {"a": {"url": "http://x"}}, "default_backend": "b"}, "default_backend 'b'"),
    ({"backends": {"a": {"url": "http://x"}}, "templates": {"t": "no slot"}}, "templates"),
])
def test_bad_settings_name_the_setting(data, message) -> None:
    with pytest.raises(GatewayConfigError, match=message):
        parse_config(data, source="test")


def test_no_backends_says_what_to_do() -> None:
    with pytest.raises(GatewayConfigError, match="ABLAB_GATEWAY_BACKENDS"):
        load_settings(env={})


def test_entropy_compression_with_the_in_repo_scorer() -> None:
    pytest.importorskip("torch")
    from ablab.inference.compression import compress

    text = "Compute 12+34 and then 12+34 again, PLEASE!"
    short = compress(text, 0.9, 8)
    assert len(short) < len(text)  # the scorer finds some digits predictable
    assert short.startswith("C") and short.endswith("PLEASE!")  # characters it does not know are kept
    assert compress(text, 0.0, 8) == text  # tau 0 keeps everything
