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
