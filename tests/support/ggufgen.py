"""Write tiny random-weight llama GGUF models with gguf.GGUFWriter, for fast tests.

The vocabulary is GPT-2 byte-level BPE: the 256 byte symbols, a few merges learned from a fixed
sample text, and ChatML special tokens, so prompts tokenize and chat templates render as they do
for real models.
"""
from __future__ import annotations

import functools
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_SPECIAL = {"0": -100, "1": -100, "2": -100}  # logit_bias banning those (ids 0-2)
# general.file_type speaks LlamaFileType, not tensor type ids
FILE_TYPE = {
    GGMLQuantizationType.F32: LlamaFileType.ALL_F32,
    GGMLQuantizationType.F16: LlamaFileType.MOSTLY_F16,
    GGMLQuantizationType.BF16: LlamaFileType.MOSTLY_BF16,
    GGMLQuantizationType.Q8_0: LlamaFileType.MOSTLY_Q8_0,
    GGMLQuantizationType.Q4_0: LlamaFileType.MOSTLY_Q4_0,
    GGMLQuantizationType.Q4_1: LlamaFileType.MOSTLY_Q4_1,
    GGMLQuantizationType.Q5_0: LlamaFileType.MOSTLY_Q5_0,
    GGMLQuantizationType.Q5_1: LlamaFileType.MOSTLY_Q5_1,
    GGMLQuantizationType.Q4_K: LlamaFileType.MOSTLY_Q4_K_M,
    GGMLQuantizationType.Q5_K: LlamaFileType.MOSTLY_Q5_K_M,
    GGMLQuantizationType.Q6_K: LlamaFileType.MOSTLY_Q6_K,
    GGMLQuantizationType.Q2_K: LlamaFileType.MOSTLY_Q2_K,
    GGMLQuantizationType.Q3_K: LlamaFileType.MOSTLY_Q3_K_M,
    GGMLQuantizationType.IQ4_NL: LlamaFileType.MOSTLY_IQ4_NL,
    GGMLQuantizationType.IQ4_XS: LlamaFileType.MOSTLY_IQ4_XS,
}
SAMPLE = ("the quick brown fox jumps over the lazy dog. hello world, this is a tiny model "
          "that speaks in random tokens; the end. Hello there! What is the capital of France?")


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def tensor_type_field(data: bytes, name: str) -> int:
    """Byte position of a tensor's u32 type in a GGUF header (its u64 data offset follows it),
    found by the tensor's name, so tests can corrupt one field of a valid file."""
    key = len(name).to_bytes(8, "little") + name.encode()
    pos = data.index(key) + len(key)
    n_dims = int.from_bytes(data[pos:pos + 4], "little")
    return pos + 4 + 8 * n_dims


def _learn_merges(n_merges: int) -> tuple[list[str], list[str]]:
    b2u = byte_to_unicode()
    words = [[b2u[b] for b in (" " + w).encode()] for w in SAMPLE.split(" ")]
    tokens: list[str] = []
    merges: list[str] = []
    for _ in range(n_merges):
        pairs = Counter((w[i], w[i + 1]) for w in words for i in range(len(w) - 1))
        if not pairs:
            break
        (a, b), _count = pairs.most_common(1)[0]
        merges.append(f"{a} {b}")
        tokens.append(a + b)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [a + b]
                i += 1
    return tokens, merges


def _random_tensor(qtype: GGMLQuantizationType, n_rows: int, n_cols: int,
                   rng: np.random.Generator) -> np.ndarray:
    """Random weights of the size real models have (|w| ~ 0.05), raw blocks unless F32."""
    if qtype == GGMLQuantizationType.F32:
        return (rng.standard_normal((n_rows, n_cols)) * 0.05).astype(np.float32)
    from engine.formats.quants import random_quant_matrix

    return random_quant_matrix(qtype, n_rows, n_cols, rng).raw


def add_keys(w: GGUFWriter, keys: dict[str, str | int | float], unsigned: bool = False) -> None:
    """Metadata keys typed from their Python values: strings, float32, and int32 (uint32 with
    `unsigned`, as llama.cpp writes counts)."""
    for key, value in keys.items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif unsigned:
            w.add_uint32(key, value)
        else:
            w.add_int32(key, value)


def write_tiny_llama(path: str | Path, *, qtype: GGMLQuantizationType = GGMLQuantizationType.Q8_0,
                     n_layer: int = 2, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                     n_ff: int = 128, n_ctx_train: int = 256, n_merges: int = 40,
                     tied_output: bool = True, output_qtype: GGMLQuantizationType | None = None,
                     rope_base: float = 10000.0, seed: int = 0, name: str = "Tiny Llama",
                     chat_template: str | None = CHATML, split_max_tensors: int = 0,
                     metadata: dict[str, float | int | str] | None = None,
                     extra_specials: tuple[str, ...] = (),
                     experts: tuple[int, int, int] | None = None) -> Path:
    """Write a valid llama-architecture GGUF with random weights; returns its path.
    `extra_specials` are control tokens after ChatML's (e.g. Harmony's markers). `experts`
    (n_expert, n_expert_used, n_ff_exp) makes it a qwen3moe instead: q/k norms, a float32
    router and stacked experts of `qtype` in place of the FFN.

    K-quant and IQ4_XS types need n_embd and n_ff to be multiples of 256. With split_max_tensors, the model
    is split in parts of that many tensors (NAME-00001-of-0000N.gguf); the first part is returned.
    """
    path = Path(path)
    rng = np.random.default_rng(seed)
    b2u = byte_to_unicode()
    merged, merges = _learn_merges(n_merges)
    specials = SPECIALS + list(extra_specials)
    tokens = specials + [b2u[b] for b in range(256)] + merged
    types = [3] * len(specials) + [1] * (len(tokens) - len(specials))
    n_vocab = len(tokens)
    head_dim = n_embd // n_head

    arch = "llama" if experts is None else "qwen3moe"
    w = GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    w.add_name(name)
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_freq_base(rope_base)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    if experts is not None:
        w.add_expert_count(experts[0])
        w.add_expert_used_count(experts[1])
        w.add_expert_feed_forward_length(experts[2])
    w.add_file_type(int(FILE_TYPE[qtype]))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    add_keys(w, metadata or {})  # extra keys, e.g. general.sampling.temp

    def add(name: str, n_rows: int, n_cols: int, q: GGMLQuantizationType) -> None:
        data = _random_tensor(q, n_rows, n_cols, rng)
        if q == GGMLQuantizationType.F32:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=q)

    def add_norm(name: str, n: int) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    add("token_embd.weight", n_vocab, n_embd, output_qtype or qtype)
    for i in range(n_layer):
        add_norm(f"blk.{i}.attn_norm.weight", n_embd)
        add(f"blk.{i}.attn_q.weight", n_head * head_dim, n_embd, qtype)
        add(f"blk.{i}.attn_k.weight", n_head_kv * head_dim, n_embd, qtype)
        add(f"blk.{i}.attn_v.weight", n_head_kv * head_dim, n_embd, qtype)
        add(f"blk.{i}.attn_output.weight", n_embd, n_head * head_dim, qtype)
        add_norm(f"blk.{i}.ffn_norm.weight", n_embd)
        if experts is not None:
            n_exp, _, n_ff_exp = experts
            add_norm(f"blk.{i}.attn_q_norm.weight", head_dim)
            add_norm(f"blk.{i}.attn_k_norm.weight", head_dim)
            add(f"blk.{i}.ffn_gate_inp.weight", n_exp, n_embd, GGMLQuantizationType.F32)
            for name, rows, cols in (("gate", n_ff_exp, n_embd), ("up", n_ff_exp, n_embd),
                                     ("down", n_embd, n_ff_exp)):
                data = np.stack([_random_tensor(qtype, rows, cols, rng) for _ in range(n_exp)])
                w.add_tensor(f"blk.{i}.ffn_{name}_exps.weight", data, raw_dtype=qtype)
            continue
        add(f"blk.{i}.ffn_gate.weight", n_ff, n_embd, qtype)
        add(f"blk.{i}.ffn_up.weight", n_ff, n_embd, qtype)
        add(f"blk.{i}.ffn_down.weight", n_embd, n_ff, qtype)
    add_norm("output_norm.weight", n_embd)
    if not tied_output:
        add("output.weight", n_vocab, n_embd, output_qtype or qtype)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    parts = sorted(path.parent.glob(f"{path.stem}-00001-of-*.gguf"))
    return parts[0] if split_max_tensors and parts else path


@functools.cache
def _servable_bytes() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        return write_tiny_llama(Path(tmp) / "stub.gguf", n_layer=1).read_bytes()


def write_servable(path: str | Path) -> Path:
    """A small GGUF the engine can serve, for tests that only need a model file to exist and
    pass the config's servability check (the same bytes each time: written once per run)."""
    path = Path(path)
    path.write_bytes(_servable_bytes())
    return path
