"""type_k / type_v in a config file: the served model's cache has those rows, the registry's
memory estimate counts them, and a bad pair is an error at its line."""
import textwrap
from pathlib import Path

import pytest

from gateway.config.loader import load_config
from gateway.config.problems import ConfigError
from gateway.fleet.registry.slots import engine_estimator
from gateway.local.served_model import load_served_model
from tests.support.refs import SYNTH_DIR

SYNTH = SYNTH_DIR / "qwen3_d64_hd32_qknorm_f32.gguf"   # head_dim 32: one block a row


def _config(folder: Path, body: str) -> Path:
    path = folder / "config.yaml"
    path.write_text(textwrap.dedent(body))
    return path


def test_a_served_entry_gets_a_q8_0_cache_the_estimate_counts(tmp_path: Path) -> None:
    configs = [load_config(_config(tmp_path, f"""
        models:
          - model: {SYNTH}
            n_ctx: 256
            n_parallel: 2
            type_k: {k}
            type_v: {v}
        """)).models[0] for k, v in (("f16", "f16"), ("8", "q8_0"))]
    f16_entry, q8_entry = configs
    assert q8_entry.kv_cache_types == ("q8_0", "q8_0")
    served = load_served_model(q8_entry)
    try:
        cache = served.model.transformer.cache
        assert (cache.type_k.name, cache.type_v.name) == ("q8_0", "q8_0")
        saved = engine_estimator(f16_entry) - engine_estimator(q8_entry)
        assert saved == cache.nbytes * 32 // 17 - cache.nbytes   # f16's 64 bytes vs q8_0's 34
    finally:
        served.close()


def test_a_quantized_cache_without_flash_attention_is_an_error_at_its_line(tmp_path: Path) -> None:
    path = _config(tmp_path, f"models:\n  - model: {SYNTH}\n    type_k: q8_0\n    type_v: q8_0\n"
                             "    flash_attn: false\n")
    with pytest.raises(ConfigError, match=rf"{path}:2: models.0: .*requires flash_attn"):
        load_config(path)
