import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from ablab.platform.config import Settings
from ablab.platform.strategy import FACTOR_NAMES, Strategy


def test_settings_layers_defaults_file_env(tmp_path, monkeypatch) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("api_port: 9001\nkafka_bootstrap: 10.0.0.1:9092\n")
    monkeypatch.setenv("ABLAB_CONFIG", str(config))
    monkeypatch.setenv("ABLAB_KAFKA_BOOTSTRAP", "127.0.0.1:19092")
    settings = Settings()
    assert settings.api_port == 9001  # from the file
    assert settings.kafka_bootstrap == "127.0.0.1:19092"  # env beats file
    assert settings.dashboard_port == 8501  # default


def test_production_refuses_the_public_webhook_secret(monkeypatch) -> None:
    monkeypatch.delenv("ABLAB_CONFIG", raising=False)
    with pytest.raises(ValidationError, match="WEBHOOK_SECRET"):
        Settings(env="production")
    assert Settings(env="production", webhook_secret="x" * 32).env == "production"


def test_public_dict_hides_secrets() -> None:
    s = Settings(database_url="postgresql+psycopg://u:hunter2@db/ablab", webhook_secret="topsecret")
    dumped = json.dumps(s.public_dict())
    assert "hunter2" not in dumped and "topsecret" not in dumped


def test_unknown_factor_is_rejected_with_its_name() -> None:
    with pytest.raises(ValidationError) as info:
        Strategy.model_validate({"sparse_k": 32})
    assert info.value.errors()[0]["loc"] == ("sparse_k",)


def test_content_hash_is_stable_and_default_insensitive() -> None:
    assert Strategy().content_hash == Strategy.model_validate({"precision": "fp32"}).content_hash
    assert Strategy(sparse_ffn_k=32).content_hash != Strategy().content_hash
    code = "from ablab.platform.strategy import Strategy; print(Strategy(sparse_ffn_k=32, kv_shards=4).content_hash)"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "1"})
    assert other.stdout.strip() == Strategy(sparse_ffn_k=32, kv_shards=4).content_hash


def test_factors_cover_the_schema() -> None:
    assert {"sparse_ffn_k", "kv_shards", "precision", "lora_adapter", "compression.tau", "batching.policy", "cot_depth"} <= set(FACTOR_NAMES)


def test_fields_added_after_v1_keep_every_earlier_hash() -> None:
    """Hashes as stored before the batching SLO fields existed (main at 91c50c2)."""
    stored = {
        "19058e0a7156d2bd": {},
        "4b0fbc8cc4b47487": {"sparse_ffn_k": 192},
        "21aa5a32dd9c4067": {"batching": {"policy": "adaptive", "max_batch": 16}},
        "3dd8d249a4a91551": {"precision": "int8", "kv_shards": 4},
    }
    for digest, body in stored.items():
        assert Strategy.model_validate(body).content_hash == digest
    explicit = {"batching": {"policy": "adaptive", "max_batch": 16, "ttft_slo_ms": None, "shed_late": False}}
    assert Strategy.model_validate(explicit).content_hash == "21aa5a32dd9c4067"
    with_slo = {"batching": {"policy": "adaptive", "max_batch": 16, "ttft_slo_ms": 200, "shed_late": True}}
    assert Strategy.model_validate(with_slo).content_hash != "21aa5a32dd9c4067"


@pytest.mark.parametrize(
    "batching, field",
    [
        ({"policy": "fixed", "ttft_slo_ms": 100}, "batching.ttft_slo_ms"),
        ({"policy": "none", "shed_late": True}, "batching.shed_late"),
        ({"policy": "adaptive", "shed_late": True}, "batching.ttft_slo_ms"),
        ({"policy": "adaptive", "tpot_slo_ms": 0}, "tpot_slo_ms"),
    ],
)
def test_slo_fields_are_validated_with_their_name(batching, field) -> None:
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        Strategy.model_validate({"batching": batching})
