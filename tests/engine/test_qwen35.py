"""qwen35 (Qwen3.5's hybrid: Gated DeltaNet layers and gated attention) against llama.cpp on the
tiny models of tests/data/synth3 (README there): batched, one token at a time, split in two
calls (the second from the cached conv and delta-rule state), greedy; the features llama.cpp's
refs switched off move our logits as much as theirs; batched beside other sequences; a request
resumes from a state checkpoint with the logits of a fresh run.

llama.cpp ran flash attention off, so the engine does too (as tests/test_synth_archs.py).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

import engine
from engine.batch import BatchRunner, Sequence
from engine.kv import RecurrentRollbackError
from engine.model import Chunk
from engine.sampling import SamplingParams
from engine.servable import check_servable, why_not_servable
from tests.support.batch_checks import alone, assert_same_or_near_tie, run_all
from tests.support.llama_cpp_checks import assert_greedy_until_a_near_tie, assert_synth_logits, assert_within
from tests.support.refs import SYNTH3_DIR

MANIFEST = json.loads((SYNTH3_DIR / "qwen35_manifest.json").read_text())
ENTRIES = {e["file"][:-len(".gguf")]: e for e in MANIFEST["models"] if e["arch"] == "qwen35"}
F32 = "qwen35_d64_l4_gdn_f32"
Q8 = "qwen35_d64_l4_gdn_q8_0"
GREEDY = SamplingParams(temperature=0.0)


def _load(name: str, **kw) -> engine.Model:
    return engine.load(SYNTH3_DIR / f"{name}.gguf", n_ctx=kw.pop("n_ctx", 128), n_threads=2,
                       flash_attn=kw.pop("flash_attn", False), **kw)


def test_the_files_are_the_ones_the_manifest_describes() -> None:
    assert set(ENTRIES) == {F32, Q8}
    for name, entry in ENTRIES.items():
        hp = check_servable(SYNTH3_DIR / f"{name}.gguf")
        want = entry["hparams"]
        assert hp.extra["d_conv"] == want["ssm_d_conv"]
        assert hp.extra["ssm_conv_dim"] == want["conv_dim (2*key_dim + value_dim)"]
        assert (hp.extra["n_group"], hp.extra["dt_rank"]) == (
            want["ssm_n_group (k heads)"], want["ssm_dt_rank (v heads)"])
        assert hp.n_rot == want["n_rot"] and hp.head_dim == entry["dims"]["head_dim"]
        assert hp.spec.recurrent is not None
        assert list(hp.spec.recurrent(hp).layers) == want["recurrent_layers"]


@pytest.mark.parametrize("name", list(ENTRIES))
def test_logits_match_llama_cpp_batched_sequential_and_split(name: str) -> None:
    ref = np.load(SYNTH3_DIR / f"{name}.npz")
    with _load(name, n_slots=3) as model:
        assert_synth_logits(model.transformer, ref, ENTRIES[name]["suggested_tolerance"], name)

@pytest.mark.parametrize("name", list(ENTRIES))
def test_greedy_tokens_match_llama_cpp_until_a_near_tie(name: str) -> None:
    ref = np.load(SYNTH3_DIR / f"{name}.npz")
    ids, want = ref["ids"].tolist(), ref["greedy"].tolist()
    with _load(name) as model:
        assert_greedy_until_a_near_tie(model, ids, want)


def _no_decay(layer):
    return dataclasses.replace(layer, ssm_a=np.zeros_like(layer.ssm_a))


def _identity_conv(layer):
    conv = np.zeros_like(layer.conv)
    conv[:, -1] = 1.0                                  # out[t] = in[t]
    return dataclasses.replace(layer, conv=conv)


@pytest.mark.parametrize("change, effect", [(_no_decay, "no_decay (ssm_a 0)"),
                                            (_identity_conv, "identity_conv (ssm_conv1d = last tap 1)")])
def test_switching_a_feature_off_moves_the_logits_as_llama_cpp_saw(change, effect: str) -> None:
    """With the decay or the conv switched off in the loaded weights, our logits leave
    llama.cpp's by about what its refs measured for the same change (feature_effects): the
    logits test above would see either feature computed wrong."""
    ref = np.load(SYNTH3_DIR / f"{F32}.npz")
    with _load(F32) as model:
        tr = model.transformer
        tr.weights.layers = [change(w) if w.ssm_a is not None else w for w in tr.weights.layers]
        ours = tr.forward([Chunk(0, ref["ids"].tolist(), 0)], "all")[0]
    moved = float(np.abs(ours - ref["logits"]).mean())
    assert moved == pytest.approx(ENTRIES[F32]["feature_effects"][effect]["mean_abs_diff"], rel=0.1)


# ---------------------------------------------------------------- memory, refusals, batching

@pytest.mark.parametrize("name", list(ENTRIES))
def test_the_memory_estimate_counts_the_states_and_their_checkpoints(name: str) -> None:
    path = SYNTH3_DIR / f"{name}.gguf"
    with _load(name, n_slots=2) as model:
        tr = model.transformer
        assert engine.estimate_memory(path, 128, n_slots=2) == model.memory_bytes
        assert model.memory_bytes == path.stat().st_size + tr.cache.nbytes + tr.repacked_bytes
        state = tr.cache.recurrent
        assert state is not None
        # 3 DeltaNet layers * (3 conv rows * 128 channels + 4 heads * 16 * 16), float32, per
        # state; a slot holds its live state and max_checkpoints more
        one = 4 * 3 * (3 * 128 + 4 * 16 * 16)
        assert state.shape.state_bytes() == one
        assert state.nbytes == 2 * (1 + state.max_checkpoints) * one
        kv = sum(a.nbytes for a in tr.cache.k) + sum(a.nbytes for a in tr.cache.v)
        assert kv == 2 * 2 * 1 * 128 * 2 * 32 * 2   # one attention layer keeps KV rows


def _rewrite(src_name: str, dst: Path, drop: str = "", keys: dict | None = None,
             extra: dict[str, str] | None = None) -> Path:
    """A copy of a synth3 file without tensor `drop`, with metadata `keys` set and `extra`
    tensors added (new name -> the tensor whose data it copies)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    src = GGUFReader(str(SYNTH3_DIR / f"{src_name}.gguf"))
    w = GGUFWriter(str(dst), "qwen35")
    keys = dict(keys or {})
    for field in src.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = keys.pop(field.name, field.contents())
        w.add_key_value(field.name, value, field.types[0],
                        field.types[-1] if len(field.types) > 1 else None)
    for name, value in keys.items():
        if isinstance(value, list):
            w.add_array(name, value)
        else:
            w.add_key_value(name, value, GGUFValueType.UINT32)
    tensors = {t.name: t for t in src.tensors}
    added = [(name, tensors[copied]) for name, copied in (extra or {}).items()]
    for name, t in [*tensors.items(), *added]:
        if name == drop:
            continue
        w.add_tensor(name, np.asarray(t.data), raw_shape=tuple(reversed(t.shape.tolist())),
                     raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_a_layer_missing_a_delta_net_tensor_is_refused_from_its_header(tmp_path: Path) -> None:
    path = _rewrite(F32, tmp_path / "cut.gguf", drop="blk.1.ssm_a")
    assert why_not_servable(path) == "layer 1 is a DeltaNet layer but lacks its ssm_a tensor"


def test_a_draft_head_after_the_trunk_is_loaded_past(tmp_path: Path) -> None:
    """A file with a multi-token-prediction block (block_count 5, nextn_predict_layers 1: blk.4
    is llama.cpp's draft head, run only for speculation) serves its 4-block trunk: the logits
    of the file without it, bit for bit."""
    extra = {f"blk.4.{part}": f"blk.3.{part}" for part in (
        "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
        "attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight",
        "post_attention_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")}
    extra["blk.4.nextn.enorm.weight"] = "output_norm.weight"
    path = _rewrite(F32, tmp_path / "mtp.gguf", keys={"qwen35.block_count": 5,
                                                      "qwen35.nextn_predict_layers": 1}, extra=extra)
    ids = np.load(SYNTH3_DIR / f"{F32}.npz")["ids"].tolist()
    assert why_not_servable(path) is None
    with engine.load(path, n_ctx=128, n_threads=2, flash_attn=False) as model:
        assert model.transformer.hp.n_layer == 4
        with_draft = model.transformer.forward([Chunk(0, ids, 0)], "all")[0]
    with _load(F32) as model:
        np.testing.assert_array_equal(with_draft, model.transformer.forward([Chunk(0, ids, 0)], "all")[0])


def test_the_files_recurrent_layers_array_decides_each_layers_kind(tmp_path: Path) -> None:
    """attention.recurrent_layers (the converter writes it from layer_types) is read per layer:
    the file's own interleave loads as before, another one is refused by the tensors it lacks."""
    same = _rewrite(F32, tmp_path / "same.gguf",
                    keys={"qwen35.attention.recurrent_layers": [True, True, True, False]})
    other = _rewrite(F32, tmp_path / "other.gguf",
                     keys={"qwen35.attention.recurrent_layers": [True, False, True, False]})
    assert why_not_servable(same) is None
    assert why_not_servable(other) == "layer 1 is an attention layer but lacks its wq tensor"


def test_a_greedy_token_does_not_depend_on_the_batch() -> None:
    """Six sequences batched, prompts in budgeted chunks beside decodes (their states side by
    side in one recurrent step): each gets the tokens it gets alone."""
    rng = np.random.default_rng(5)
    prompts = [[494, *rng.integers(0, 493, n).tolist()] for n in (5, 31, 12, 40, 3, 22)]
    with _load(Q8, n_slots=6) as model:
        expected = [alone(model, ids, GREEDY, 12) for ids in prompts]
        runner = BatchRunner(model, prefill_budget=16)
        seqs = [Sequence(ids, params=GREEDY, max_tokens=12, stop_at_eog=False) for ids in prompts]
        for seq in seqs:
            runner.submit(seq)
        run_all(runner)
        runner.close()
        for ids, want, seq in zip(prompts, expected, seqs):
            assert_same_or_near_tie(model, ids, want, seq.generated)


# ---------------------------------------------------------------- checkpoints and prefix reuse

def test_a_slot_goes_back_to_a_checkpoint_and_continues_as_a_fresh_run() -> None:
    """Slot 0 reads 24 tokens (checkpoints at the chunk's end and the token before: the chunk
    asks for logits, so it ends a prompt), then 10 more and 3 decodes;
    going back to 24 and reading another continuation gives bit for bit what a slot that read
    the same chunks from nothing gives, and within float rounding what one whole chunk gives."""
    ids = np.load(SYNTH3_DIR / f"{F32}.npz")["ids"].tolist()
    with _load(F32, n_slots=3) as model:
        tr, cache = model.transformer, model.transformer.cache
        tr.forward([Chunk(0, ids[:24], 0)])
        tr.forward([Chunk(0, ids[24:34], 24)])
        for i, t in enumerate(ids[34:37]):
            tr.forward([Chunk(0, [t], 34 + i)])
        assert cache.recurrent is not None and cache.recurrent.checkpoints(0) == [23, 24, 33, 34]
        assert cache.reusable(0, 30) == 24                       # the state at 30 is gone
        assert cache.reusable(0, 37) == 37                       # the live state
        with pytest.raises(RecurrentRollbackError):
            cache.truncate(0, 30)
        assert len(cache.tokens[0]) == 37                        # nothing changed
        cache.truncate(0, 24)
        other = ids[30:40]
        resumed = tr.forward([Chunk(0, other, 24)], "all")[0]
        tr.forward([Chunk(1, ids[:24], 0)])
        fresh = tr.forward([Chunk(1, other, 24)], "all")[0]
        whole = tr.forward([Chunk(2, ids[:24] + other, 0)], "all")[0][24:]
    np.testing.assert_array_equal(resumed, fresh)
    np.testing.assert_allclose(resumed, whole, atol=1e-4)


def test_a_request_sharing_a_prefix_resumes_from_a_checkpoint() -> None:
    """Through the batch runner: a first request's prompt (45 tokens) is read in chunks of 16,
    so its slot keeps states at 16, 32, 44 and 45; a second request sharing its first 37
    tokens resumes at 32 (32 tokens not recomputed, counted) and generates what a fresh run
    generates, with the fresh run's logits at its prompt's end."""
    rng = np.random.default_rng(11)
    shared = [494, *rng.integers(0, 493, 36).tolist()]
    first = shared + rng.integers(0, 493, 8).tolist()
    second = shared + rng.integers(0, 493, 5).tolist()
    with _load(F32, n_slots=1) as model:
        runner = BatchRunner(model, prefill_budget=16)
        a = Sequence(first, params=GREEDY, max_tokens=4, stop_at_eog=False)
        runner.submit(a)
        run_all(runner)
        assert a.cached == 0
        b = Sequence(second, params=GREEDY, max_tokens=6, stop_at_eog=False)
        runner.submit(b)
        reused = runner.step().reused_tokens
        run_all(runner)
        runner.close()
        assert (b.cached, reused) == (32, 32)
        resumed_logits = model.transformer.forward([Chunk(0, second[32:], 32)])[0]
        fresh = alone(model, second, GREEDY, 6)
        fresh_logits = model.logits(second)[-1]
    assert b.generated == fresh
    np.testing.assert_allclose(resumed_logits, fresh_logits, atol=1e-4)


def test_n_choices_of_one_prompt_read_it_once() -> None:
    """Three sequences of one prompt: the first reads it, the others take its state from the
    checkpoint one token before the prompt's end (each needs that token's logits) and read
    only that token; all three generate what one alone does."""
    ids = np.load(SYNTH3_DIR / f"{F32}.npz")["ids"].tolist()
    with _load(F32, n_slots=3) as model:
        runner = BatchRunner(model)
        seqs = [Sequence(ids, params=GREEDY, max_tokens=5, stop_at_eog=False) for _ in range(3)]
        for seq in seqs:
            runner.submit(seq)
        run_all(runner)
        runner.close()
        want = alone(model, ids, GREEDY, 5)
    assert [s.cached for s in seqs] == [0, len(ids) - 1, len(ids) - 1]
    assert all(s.generated == want for s in seqs)


def test_a_failed_pass_leaves_no_half_moved_state(monkeypatch) -> None:
    """A pass that fails after some DeltaNet layers moved their states on (here the third
    layer's) leaves its slots empty, so nothing resumes from a state its tokens do not match."""
    import engine.builders

    ids = np.load(SYNTH3_DIR / f"{F32}.npz")["ids"].tolist()
    real = engine.builders.delta_net_layer

    def failing(mm, h, w, d, state, layer, chunks):
        if layer == 2:
            raise RuntimeError("out of memory")
        return real(mm, h, w, d, state, layer, chunks)

    with _load(F32) as model:
        tr = model.transformer
        tr.forward([Chunk(0, ids[:20], 0)])
        monkeypatch.setattr(engine.builders, "delta_net_layer", failing)
        with pytest.raises(RuntimeError):
            tr.forward([Chunk(0, ids[20:], 20)])
        monkeypatch.undo()
        assert tr.cache.tokens[0] == [] and tr.cache.reusable(0, 20) == 0
        assert not tr.cache.recurrent.ssm[0].any()
        again = tr.forward([Chunk(0, ids, 0)], "all")[0]
    assert_within(again, np.load(SYNTH3_DIR / f"{F32}.npz")["logits"],
                  ENTRIES[F32]["suggested_tolerance"], "after a failed pass")
