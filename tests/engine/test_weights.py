"""engine.weights walks a family's declaration (engine/arch/declare.py): optional tensors may be
absent, required ones are named when missing, fused ones are served as views of their rows, and
a family's own key can size a tensor. Expectations come from gguf-py's reading of the same files
and from the stock families' logits."""
from __future__ import annotations

import dataclasses
from contextlib import closing
from pathlib import Path

import gguf
import numpy as np
import pytest

import engine
from engine.arch import SPECS, Layer, llama
from engine.arch.base import ArchSpec
from engine.arch.declare import Key, Tensor, fuse
from engine.gguf import GGUFFile, ModelLoadError, TensorInfo, read_header
from engine.hparams import HParams
from engine.servable import judge_header
from engine.weights import load_weights
from tests.support.ggufgen import write_tiny_llama
from tests.support.refs import SYNTH_DIR

OPTIONAL_BIAS = tuple(dataclasses.replace(t, required=False) for t in llama.QKV_BIAS)


def _file_tensor(path: Path, name: str) -> np.ndarray:
    [t] = [t for t in gguf.GGUFReader(str(path)).tensors if t.name == name]
    return np.asarray(t.data)


def _logits(path: Path, ids: list[int]) -> np.ndarray:
    with engine.load(path, n_ctx=64, n_threads=2) as m:
        return m.logits(ids)


def test_an_absent_optional_tensor_leaves_its_field_none(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf", qtype=gguf.GGMLQuantizationType.F32)
    ids = [5, 17, 40, 3, 99]
    stock = _logits(path, ids)
    monkeypatch.setitem(SPECS, "llama", dataclasses.replace(
        llama.SPEC, tensors=llama.TENSORS + OPTIONAL_BIAS))
    hp = HParams.from_metadata(dict(read_header(path)[0]), str(path))
    with closing(GGUFFile(path)) as f:
        layers = load_weights(f, hp, 64).layers
        assert all(isinstance(w, llama.LlamaLayer) and w.bq is None and w.bv is None
                   for w in layers)
    np.testing.assert_array_equal(_logits(path, ids), stock)


def test_a_present_optional_tensor_is_read_and_used(monkeypatch: pytest.MonkeyPatch) -> None:
    path = SYNTH_DIR / "qwen2_d64_gqa2_bias_f32.gguf"
    ids = np.load(SYNTH_DIR / "qwen2_d64_gqa2_bias_f32.npz")["ids"].tolist()[:12]
    stock = _logits(path, ids)
    monkeypatch.setitem(SPECS, "qwen2", dataclasses.replace(
        SPECS["qwen2"], tensors=llama.TENSORS + OPTIONAL_BIAS))
    hp = HParams.from_metadata(dict(read_header(path)[0]), str(path))
    with closing(GGUFFile(path)) as f:
        layer = load_weights(f, hp, 64).layers[1]
        assert isinstance(layer, llama.LlamaLayer) and layer.bk is not None
        np.testing.assert_array_equal(layer.bk, _file_tensor(path, "blk.1.attn_k.bias"))
    np.testing.assert_array_equal(_logits(path, ids), stock)


@pytest.mark.parametrize("name,tensor", [
    ("qwen3_d64_hd32_qknorm_f32", "blk.1.attn_k_norm.weight"),   # a family's addition to llama's
    ("phi3_d64_fused_qkv_f32", "blk.0.attn_qkv.weight"),         # a fused one
    ("gemma2_d64_l4_softcap_f32", "blk.3.post_ffw_norm.weight"),
])
def test_a_required_tensor_the_file_lacks_is_named(name: str, tensor: str) -> None:
    path = SYNTH_DIR / f"{name}.gguf"
    meta, tensors = read_header(path)
    del tensors[tensor]
    with pytest.raises(ModelLoadError, match=rf"tensor {tensor} is missing"):
        judge_header(path, meta, tensors)


def test_fused_rows_are_views_of_the_one_tensor() -> None:
    path = SYNTH_DIR / "phi3_d64_fused_qkv_f32.gguf"
    hp = HParams.from_metadata(dict(read_header(path)[0]), str(path))
    qkv = _file_tensor(path, "blk.0.attn_qkv.weight")           # [q_dim + 2 kv_dim, n_embd]
    up = _file_tensor(path, "blk.0.ffn_up.weight")              # [2 n_ff, n_embd]
    with closing(GGUFFile(path)) as f:
        w = load_weights(f, hp, 64).layers[0]
        assert isinstance(w, llama.LlamaLayer)
        Q, KV, F = hp.q_dim, hp.kv_dim, hp.n_ff
        for m, rows in ((w.wq, qkv[:Q]), (w.wk, qkv[Q:Q + KV]), (w.wv, qkv[Q + KV:]),
                        (w.w_gate, up[:F]), (w.w_up, up[F:])):
            np.testing.assert_array_equal(m.raw.view(np.float32), rows)
        assert w.wq.raw.base is not None and w.wq.raw.base is w.wv.raw.base  # views, no copy


@dataclasses.dataclass(kw_only=True)
class _RoutedLayer(llama.LlamaLayer):
    router: np.ndarray | None = None  # float32 [n_expert] (a stand-in: a vector sized by a key)


def _routed_spec() -> ArchSpec[_RoutedLayer]:
    """llama plus a key of its own (expert_count) that sizes an optional tensor."""
    return ArchSpec("llama", llama.KEYS + (Key("n_expert", "expert_count", 0),), llama.finish,
                    _RoutedLayer, llama.TENSORS + (
                        Tensor("router", "ffn_gate_inp.weight", ("n_expert",), required=False),),
                    llama.block)


def test_a_family_key_lands_in_extra_and_sizes_its_tensors(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf", metadata={"llama.expert_count": 4}, n_layer=1)
    monkeypatch.setitem(SPECS, "llama", _routed_spec())
    meta, tensors = read_header(path)
    hp = judge_header(path, meta, tensors)                     # absent: fine
    assert hp.extra == {"n_expert": 4} and hp.dim("n_expert") == 4

    def with_router(n: int) -> dict[str, TensorInfo]:
        norm = tensors["blk.0.attn_norm.weight"]
        return {**tensors, "blk.0.ffn_gate_inp.weight": dataclasses.replace(
            norm, name="blk.0.ffn_gate_inp.weight", shape=(n,), n_bytes=4 * n)}

    judge_header(path, meta, with_router(4))
    with pytest.raises(ModelLoadError, match=r"ffn_gate_inp.weight has shape \[3\], the "
                                             r"hyperparameters say \[4\]"):
        judge_header(path, meta, with_router(3))


def test_an_undeclared_tensor_is_still_refused() -> None:
    path = SYNTH_DIR / "qwen3_d64_hd32_qknorm_f32.gguf"
    meta, tensors = read_header(path)
    norm = tensors["blk.0.attn_norm.weight"]
    tensors["blk.0.ffn_gate_inp.weight"] = dataclasses.replace(norm, name="blk.0.ffn_gate_inp.weight")
    with pytest.raises(ModelLoadError, match=r"blk.0.ffn_gate_inp.weight is not part of the "
                                             r"engine's qwen3 block"):
        judge_header(path, meta, tensors)


def test_a_layer_type_and_its_declaration_must_agree() -> None:
    with pytest.raises(TypeError, match="router is not a field of LlamaLayer"):
        ArchSpec("x", llama.KEYS, llama.finish, llama.LlamaLayer,
                 llama.TENSORS + (Tensor("router", "r.weight", ("n_embd",)),), llama.block)
    with pytest.raises(TypeError, match=r"LlamaLayer.w_down is not declared"):
        ArchSpec("x", llama.KEYS, llama.finish, llama.LlamaLayer, llama.TENSORS[:-1], llama.block)

    @dataclasses.dataclass(kw_only=True)
    class NoDefault(Layer):
        attn_norm: np.ndarray

    with pytest.raises(TypeError, match="cannot fuse"):          # wo's columns are q_dim
        fuse(llama.TENSORS, "attn_qkvo.weight", "wq", "wk", "wv", "wo")
    with pytest.raises(TypeError, match="optional attn_norm needs a default"):
        ArchSpec("x", llama.KEYS, llama.finish, NoDefault,
                 (Tensor("attn_norm", "attn_norm.weight", ("n_embd",), required=False),),
                 lambda b, w, i: None)
