"""Strict configuration: unknown keys name the nearest valid key; DLM_ variables override the file; flags override
both only when given."""

from dataclasses import asdict

import pytest
import yaml

from services.cli.cli import build_parser, serve_flags
from services.common.config import EngineConfig, LimitExceeded, Limits, ServingConfig
from services.common.config_keys import given, merge

SERVING = {"host": "0.0.0.0", "port": 6000, "redis_url": "redis://cache:6379/0"}


def write(tmp_path, raw: dict) -> str:
    path = tmp_path / "dlm.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def engine_file(tmp_path, **engine) -> str:
    return write(tmp_path, {"engine": {"models": {"guider": "models/guider"}, **engine}})


@pytest.mark.parametrize(
    ("raw", "named", "suggested"),
    [
        ({"engine": {}, "strateg": "slot"}, "'strateg'", "'engine.strategy'"),
        ({"engine": {"strateg": "slot"}}, "'strateg'", "'strategy'"),
        ({"engine": {"serving": {"redis_ur": "x"}}}, "'serving.redis_ur'", "'serving.redis_url'"),
        (
            {"engine": {"serving": {"limits": {"max_new_token": 8}}}},
            "'serving.limits.max_new_token'",
            "'serving.limits.max_new_tokens'",
        ),
        ({"engine": {"models": {"guidr": "g"}}}, "'models.guidr'", "'models.guider'"),
    ],
    ids=["top level", "engine", "serving", "limits", "models role"],
)
def test_a_typo_names_the_key_and_its_nearest_valid_name(tmp_path, raw, named, suggested):
    with pytest.raises(ValueError, match="unknown config key") as e:
        EngineConfig.from_yaml(write(tmp_path, raw), environ={})
    assert named in str(e.value) and f"did you mean {suggested}?" in str(e.value)


def test_a_key_near_nothing_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown config key 'serving.zzzzzz'; valid: .*serving.port"):
        EngineConfig(serving={"zzzzzz": 1})


def test_the_dict_the_ray_app_passes_round_trips_and_stays_strict(tmp_path):
    cfg = EngineConfig.from_yaml(engine_file(tmp_path, serving={"limits": {"max_new_tokens": 4096}}), environ={})
    again = EngineConfig.from_dict(asdict(cfg))
    assert again == cfg and again.serving.limits == Limits(max_new_tokens=4096)
    assert EngineConfig(**asdict(cfg)) == cfg  # how the deployments rebuild it
    with pytest.raises(ValueError, match="'strateg'; did you mean 'strategy'"):
        EngineConfig.from_dict({**asdict(cfg), "strateg": "slot"})


def test_environment_overrides_the_file_parsed_to_each_fields_type(tmp_path):
    path = engine_file(tmp_path, strategy="pipeline", threads=2, serving=dict(SERVING))
    environ = {
        "DLM_STRATEGY": "slot",
        "DLM_THREADS": "null",
        "DLM_CHAT_TEMPLATE": "false",
        "DLM_SERVING__PORT": "7001",
        "DLM_SERVING__REDIS_URL": "redis://other:6379/1",
        "DLM_SERVING__NUM_GPUS": "0.5",
        "DLM_SERVING__LIMITS__MAX_NEW_TOKENS": "2048",
        "DLM_STRATEGIES__STREAMING__WINDOW": "8",
        "OTHER_PORT": "1",
    }
    cfg = EngineConfig.from_yaml(path, environ=environ)
    assert (cfg.strategy, cfg.threads, cfg.chat_template) == ("slot", None, False)
    assert (cfg.serving.port, cfg.serving.redis_url, cfg.serving.num_gpus) == (7001, "redis://other:6379/1", 0.5)
    assert cfg.serving.host == "0.0.0.0" and cfg.serving.limits.max_new_tokens == 2048
    assert cfg.strategies == {"streaming": {"window": 8}}
    assert EngineConfig.from_yaml(path, environ={}).serving.port == 6000


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"DLM_SERVNG__PORT": "1"}, "DLM_SERVNG__PORT: unknown config key 'servng'; did you mean 'serving'"),
        ({"DLM_SERVING__PROT": "1"}, "unknown config key 'serving.prot'; did you mean 'serving.port'"),
        ({"DLM_SERVING__PORT": "http"}, "DLM_SERVING__PORT: expected int, got 'http'"),
        ({"DLM_CHAT_TEMPLATE": "maybe"}, "DLM_CHAT_TEMPLATE: expected a boolean"),
    ],
)
def test_a_bad_environment_variable_is_named(tmp_path, environ, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_yaml(engine_file(tmp_path), environ=environ)


def test_merge_lays_given_overrides_over_nested_keys():
    base = {"device": "cpu", "serving": {**SERVING, "max_queue": 8}}
    flags = given({"device": None, "serving": {"host": None, "port": 7000, "redis_url": None}})
    assert flags == {"serving": {"port": 7000}}
    assert merge(base, flags) == {"device": "cpu", "serving": {**SERVING, "port": 7000, "max_queue": 8}}
    assert merge(base, {"serving": {"redis_url": None}})["serving"]["redis_url"] is None  # a value, when set


def test_dlm_serve_keeps_the_configs_host_port_and_redis_unless_a_flag_is_given(tmp_path):
    path = engine_file(tmp_path, serving=dict(SERVING))
    parser = build_parser()

    def serving(*argv: str):
        cfg = EngineConfig.from_yaml(path, environ={}, serving=serve_flags(parser.parse_args(["serve", *argv])))
        return {key: getattr(cfg.serving, key) for key in SERVING}

    assert serving() == SERVING
    assert serving("--port", "7000") == {**SERVING, "port": 7000}
    assert serving("--host", "127.0.0.1", "--redis", "redis://x:1/0") == {
        **SERVING,
        "host": "127.0.0.1",
        "redis_url": "redis://x:1/0",
    }
    environ = {"DLM_SERVING__PORT": "7001"}
    flags = serve_flags(parser.parse_args(["serve", "--port", "7002"]))
    assert EngineConfig.from_yaml(path, environ=environ).serving.port == 7001
    assert EngineConfig.from_yaml(path, environ=environ, serving=flags).serving.port == 7002  # flags over env


@pytest.mark.parametrize("rid", ["x:ids", "a b", "x*", "ü", "x\n", "../x", "{x}"])
def test_request_id_outside_the_safe_alphabet_is_refused(rid):
    with pytest.raises(LimitExceeded) as err:
        Limits().check(None, [], None, rid)
    assert err.value.field == "request_id"


def test_safe_request_ids_pass():
    for rid in ("", "req-1", "A.b_c-9", "0" * 128):
        Limits().check(None, [], None, rid)


def test_secrets_are_files_or_environment_variables_never_config_keys(tmp_path):
    environ = {"DLM_API_KEY": "token-value", "DLM_REDIS_PASSWORD": "password-value"}
    environ["DLM_SERVING__API_KEY_FILE"] = "/run/secrets/key"
    cfg = EngineConfig.from_yaml(engine_file(tmp_path), environ=environ)  # the secrets are no unknown keys
    assert cfg.serving.api_key_file == "/run/secrets/key"
    assert "-value" not in str(asdict(cfg))  # nor config values the Ray app's pickled config would carry
    with pytest.raises(ValueError, match="go together"):
        ServingConfig(tls_cert_file="server.pem")
    with pytest.raises(ValueError, match="mTLS"):
        ServingConfig(tls_client_ca_file="ca.pem")


@pytest.mark.parametrize(
    "resources",
    [{"drafterr": {"node_a": 1}}, {"drafter": {"node_a": 0}}, {"guider": ["node_b"]}],
    ids=["unknown deployment", "no amount", "not a mapping"],
)
def test_serving_resources_name_the_bad_placement(resources):
    with pytest.raises(ValueError, match="serving.resources: deployment -> {resource: amount > 0}"):
        EngineConfig(serving={"resources": resources})
    assert EngineConfig(serving={"resources": {"drafter": {"node_a": 1}}}).serving.resources["drafter"] == {"node_a": 1}
