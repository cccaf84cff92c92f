"""The engine's public face: load a GGUF model, then tokenize, evaluate, generate, embed.

Prompts are token ids or an engine.prompt.Prompt (spans of ids and of embedding rows)."""
from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .constraint import Constraint
from .encoder import EncoderTransformer
from .float_products import amx_added_bytes
from .formats.repack import estimate_repacked, estimate_repacked_stacks
from .gguf import GGUFFile, ModelLoadError, split_part_paths
from .hparams import HParams
from .kernels import amx_gemm
from .kernels.gemm.facade import host_repacks
from .kernels.pool import Pool
from .kv import MAX_CHUNK, KVLayout
from .kv_types import kv_type
from .lora import LoraSpec, adapted_tensors, merged_bytes, read_deltas
from .model import Chunk, ContextOverflowError, Transformer
from .pooling import POOLINGS, SOFTMAX_RANK_ARCHS, file_pooling, model_role, normalize, pool
from .prompt import Prompt, as_prompt, common_prefix
from .rope_settings import RopeSettings
from .sampling import Sampled, Sampler, SamplingParams
from .tokenizer import Tokenizer

PREFILL_CHUNK = MAX_CHUNK  # tokens per forward call while prefilling (bounds activation memory)
ENCODER_MIN_SLOTS = 32     # texts an encoder's batch runner holds at once (no KV cache each)


class Model:
    """One loaded model. Single-threaded: one caller at a time (the server's scheduler)."""

    def __init__(self, path: str | os.PathLike[str], n_ctx: int = 4096, n_threads: int = 2,
                 n_slots: int = 1, flash_attn: bool = True, images: bool = False,
                 rope: RopeSettings | None = None, pooling: str | None = None,
                 lora: Sequence[LoraSpec] = (), type_k: str | int = "f16",
                 type_v: str | int = "f16", pool: Pool | None = None,
                 amx: bool | None = None) -> None:
        t0 = time.perf_counter()
        self.path = Path(path)
        if n_ctx <= 0 or n_slots <= 0 or n_threads <= 0:
            raise ValueError("n_ctx, n_slots and n_threads must be positive")
        self._file = GGUFFile(self.path)
        try:
            self.metadata: dict[str, Any] = self._file.metadata
            self.hparams = HParams.from_metadata(self.metadata, str(self.path)).with_rope(
                rope or RopeSettings())
            try:
                self.tokenizer = Tokenizer.from_metadata(self.metadata)
            except (KeyError, ValueError, TypeError, IndexError) as e:
                raise ModelLoadError(self.path, f"bad tokenizer metadata: {e}") from None
            if self.tokenizer.n_vocab != self.hparams.n_vocab:
                raise ModelLoadError(self.path, f"tokenizer has {self.tokenizer.n_vocab} tokens, "
                                                f"the model {self.hparams.n_vocab}")
            self.n_vocab = self.hparams.n_vocab
            self.n_embd = self.hparams.n_embd  # an embedding's length
            self.is_encoder = self.hparams.spec.is_encoder
            self.n_threads = n_threads
            try:
                kv_types = (kv_type(type_k), kv_type(type_v))
            except ValueError as e:
                raise ModelLoadError(self.path, f"KV cache: {e}") from None
            self.transformer: Transformer | EncoderTransformer
            if self.is_encoder:  # a slot costs an encoder nothing: many texts per forward
                if lora:
                    raise ModelLoadError(self.path, "LoRA adapters on an embedding model are "
                                                    "not supported")
                self.n_slots = max(n_slots, ENCODER_MIN_SLOTS)
                self.transformer = EncoderTransformer(self._file, self.hparams, n_ctx,
                                                      self.n_slots, n_threads, amx=amx)
                self.n_ctx = self.transformer.n_ctx
            else:
                self.n_ctx, self.n_slots = n_ctx, n_slots
                deltas = (read_deltas(list(lora), self.hparams.arch, self._file.tensors)
                          if lora else None)
                self.transformer = Transformer(self._file, self.hparams, n_ctx, n_slots, n_threads,
                                               flash_attn=flash_attn, images=images, lora=deltas,
                                               kv_types=kv_types, pool=pool,
                                               lora_scales=tuple(float(a.scale) for a in lora))
            self._asked_pooling = pooling
            self.pooling = self._pooling(pooling)
        except BaseException:
            self._file.close()
            raise
        chat_template = self.metadata.get("tokenizer.chat_template")
        self.chat_template: str | None = chat_template if isinstance(chat_template, str) else None
        self.load_seconds = time.perf_counter() - t0

    def _pooling(self, asked: str | None) -> str:
        """The entry's pooling, else the file's, else mean; rank needs the file's classifier."""
        kind = asked or file_pooling(self.metadata, self.hparams.arch) or "mean"
        if kind not in POOLINGS:
            raise ModelLoadError(self.path, f"unknown pooling {kind!r} (one of {', '.join(POOLINGS)})")
        if kind == "rank" and self.transformer.weights.rank_head is None:
            raise ModelLoadError(self.path, "rank pooling needs a classifier (cls.* tensors), "
                                            "which this file does not have")
        return kind

    @property
    def role(self) -> str:
        """generation, embedding or rerank (engine.pooling.model_role)."""
        asked = self._asked_pooling
        return model_role(self.metadata, self.hparams.arch, self.is_encoder, asked)

    @property
    def is_reranker(self) -> bool:
        return self.pooling == "rank"

    # -- facts -------------------------------------------------------------------------------
    @property
    def mapped_bytes(self) -> int:
        """The mapped file part of memory_bytes (shared with other loads of the same file)."""
        return self._file.file_size

    def file_changed(self) -> str | None:
        """Why the model file on disk is no longer the one mapped; None while it is (a stat)."""
        return self._file.changed()

    @property
    def memory_bytes(self) -> int:
        """Mapped file + KV cache + what repacked weights add (the most this model can hold
        resident)."""
        return (self._file.file_size + self.transformer.cache.nbytes
                + self.transformer.repacked_bytes + self.transformer.lora_bytes)

    # -- evaluation --------------------------------------------------------------------------
    def _prefill(self, prompt: Prompt | list[int], slot: int, output: str) -> list[np.ndarray]:
        """Evaluate `prompt` in `slot`, reusing the cached prefix; returns per-chunk outputs
        (for `last`, only the final chunk has logits)."""
        prompt = as_prompt(prompt)
        n = len(prompt)
        if not n:
            raise ValueError("no tokens to evaluate")
        if n > self.n_ctx:
            raise ContextOverflowError(n, self.n_ctx)
        reuse = 0
        if output == "last":  # evaluate at least one position to get logits
            held = self.transformer.cache.tokens[slot]
            reuse = prompt.resume_point(min(common_prefix(held, prompt.position_keys()), n - 1))
            reuse = self.transformer.cache.reusable(slot, reuse)  # a ring may have moved on
        outs = []
        start = reuse
        while start < n:  # a bidirectional span is read whole (Prompt.chunk_end)
            part = prompt[start:prompt.chunk_end(start, min(start + PREFILL_CHUNK, n))]
            final = start + len(part) == n  # `last` needs only the final chunk's logits
            outs.append(self.transformer.forward([Chunk(slot, part, start, logits=final)], output)[0])
            start += len(part)
        return outs

    def logits(self, prompt: Prompt | list[int]) -> np.ndarray:
        """float32 [len(prompt), n_vocab]: logits at every position, evaluated in a fresh context."""
        self.transformer.cache.truncate(0, 0)
        return np.concatenate(self._prefill(as_prompt(prompt), 0, "all"), axis=0)

    def hidden(self, prompt: Prompt | list[int]) -> np.ndarray:
        """float32 [n, n_embd]: the final hidden states of `prompt` (normed, for a decoder)."""
        self.transformer.cache.truncate(0, 0)
        if isinstance(self.transformer, EncoderTransformer):
            return self.transformer.encode([as_prompt(prompt).token_ids()])[0]
        return np.concatenate(self._prefill(as_prompt(prompt), 0, "hidden"), axis=0)

    def pool(self, hidden: np.ndarray) -> np.ndarray:
        """This model's pooling of one text's hidden states (engine.pooling), not normalised."""
        return pool(hidden, self.pooling, self.transformer.weights.rank_head,
                    causal=not self.is_encoder,
                    softmax=self.hparams.arch in SOFTMAX_RANK_ARCHS)

    def pooled(self, prompt: Prompt | list[int]) -> np.ndarray:
        """pool(hidden(prompt)): an embedding, per-token vectors (none) or rank scores."""
        return self.pool(self.hidden(prompt))

    def pooled_many(self, prompts: list[list[int]]) -> list[np.ndarray]:
        """pooled() of each prompt, as many as the slots hold evaluated in one forward pass
        (an encoder: all of them; a decoder: one whole prompt per slot)."""
        if isinstance(self.transformer, EncoderTransformer):
            return [self.pool(h) for h in self.transformer.encode(prompts)]
        out: list[np.ndarray] = []
        for at in range(0, len(prompts), self.n_slots):
            group = prompts[at:at + self.n_slots]
            if any(len(p) > min(PREFILL_CHUNK, self.n_ctx) or not p for p in group):
                out += [self.pooled(p) for p in group]
                continue
            for slot in range(len(group)):
                self.transformer.cache.truncate(slot, 0)
            chunks = [Chunk(slot, p, 0, logits=0) for slot, p in enumerate(group)]
            out += [self.pool(h) for h in self.transformer.forward(chunks, "hidden")]
        return out

    def embed(self, prompt: Prompt | list[int]) -> np.ndarray:
        """float32 [n_embd]: the pooled final hidden states, L2-normalised (mean pooling for a
        decoder whose file names none)."""
        return normalize(self.pooled(prompt))

    def stream(self, prompt: Prompt | list[int], params: SamplingParams | None = None,
               max_tokens: int = 256, stop_at_eog: bool = True,
               constraint: Constraint | None = None) -> Iterator[Sampled]:
        """Prefill `prompt`, then sample up to `max_tokens` tokens one by one.

        Stops before yielding an end-of-generation token when `stop_at_eog`, when the context
        is full, and after the token that completes `constraint` (a grammar every token follows,
        engine/constraint.py). Raises ContextOverflowError when the prompt alone fills the context.
        """
        prompt = as_prompt(prompt)
        if len(prompt) >= self.n_ctx:
            raise ContextOverflowError(len(prompt), self.n_ctx)
        sampler = Sampler(params or SamplingParams(), prompt.token_ids())
        logits = self._prefill(prompt, 0, "last")[-1]
        pos = len(prompt)
        eog = self.tokenizer.eog_ids
        for _ in range(max_tokens):
            s = sampler.sample(logits, constraint.allowed() if constraint is not None else None)
            if stop_at_eog and s.token in eog:
                return
            yield s
            if constraint is not None and (not constraint.consume(s.token) or constraint.done):
                return
            if pos >= self.n_ctx:
                return
            logits = self.transformer.forward([Chunk(0, [s.token], pos)], "last")[0]
            pos += 1

    def generate(self, prompt: Prompt | list[int], max_tokens: int = 64, temperature: float = 0.0,
                 stop_at_eog: bool = True, **sampling: Any) -> Iterator[int]:
        params = SamplingParams(temperature=temperature, **sampling)
        for s in self.stream(prompt, params, max_tokens, stop_at_eog):
            yield s.token

    def close(self) -> None:
        """Free the KV cache and kernels and unmap the file."""
        if getattr(self, "transformer", None) is not None:
            self.transformer.close()
            self.transformer = None  # type: ignore[assignment]
        if getattr(self, "_file", None) is not None:
            self._file.close()
            self._file = None  # type: ignore[assignment]

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(path: str | os.PathLike[str], n_ctx: int = 4096, n_threads: int = 2,
         n_slots: int = 1, flash_attn: bool = True, images: bool = False,
         name: str | None = None, rope: RopeSettings | None = None,
         pooling: str | None = None, lora: Sequence[LoraSpec] = (), type_k: str | int = "f16",
         type_v: str | int = "f16", pool: Pool | None = None, amx: bool | None = None) -> Model:
    """Load a GGUF model; raises ModelLoadError naming the file and the problem.

    flash_attn picks which of llama.cpp's attention paths the numerics follow: its flash
    attention (the default) or its plain path (q and probabilities rounded to f16), as
    llama.cpp runs with flash attention off. images: it will be fed image spans (an mmproj is
    paired with it), which some families attend to bidirectionally (engine.model.Transformer).
    rope: a load's rope settings over the file's (llama.cpp's context parameters:
    engine.rope_settings). pooling: how embed/pooled pool a text (engine.pooling), None: the
    file's, else mean. lora: adapters merged into the weights at load (engine.lora; a bad
    adapter is a ModelLoadError naming its file). type_k / type_v: the KV cache's row types,
    llama.cpp's names or ggml numbers (engine.kv_types). pool: run on another loaded model's
    worker pool (a draft model on its target's; Transformer). amx: an encoder's F16 projections
    on AMX tiles (engine.float_products; None: where the CPU has them, False: the
    portable FMA path). Kernels compiled on the way (a cold
    cache) are logged as being compiled for `name` (default: the file's stem), with progress."""
    from .kernels import jit

    with jit.reporting(name or Path(path).stem):
        return Model(path, n_ctx=n_ctx, n_threads=n_threads, n_slots=n_slots,
                     flash_attn=flash_attn, images=images, rope=rope, pooling=pooling,
                     lora=lora, type_k=type_k, type_v=type_v, pool=pool, amx=amx)


def estimate_memory(path: str | os.PathLike[str], n_ctx: int, n_slots: int = 1,
                    images: bool = False, lora: Sequence[LoraSpec] = (),
                    type_k: str | int = "f16", type_v: str | int = "f16") -> int:
    """Bytes a load would hold (mapped files + KV cache + repacked weights, as Model.memory_bytes
    counts them, rings of sliding-window layers included, LoRA adapters' merged float32 copies
    too), from the headers alone. Raises
    ModelLoadError when the file cannot be served at all (the registry then fails the request
    rather than evict anything for a load that cannot succeed). type_k / type_v: the KV
    cache's row types (engine.kv_types: names or ggml numbers)."""
    from .servable import judge_header, read_model_header

    meta, tensors = read_model_header(path)  # read once: Gemma 3 270M's header takes ~0.1 s
    hp = judge_header(path, meta, tensors)
    count = meta.get("split.count", 1)
    files = split_part_paths(Path(path), count) if isinstance(count, int) and count > 1 else [path]
    adapted = adapted_tensors(lora)
    shapes = {n: (t.qtype, t.shape[1], t.shape[0]) for n, t in tensors.items()
              if len(t.shape) == 2 and n not in adapted}  # an adapted matrix is float32, not repacked
    stacks = {n: (t.qtype, t.shape[1], t.shape[0], t.shape[2]) for n, t in tensors.items()
              if len(t.shape) == 3}
    layout = KVLayout(hp, n_ctx, images and hp.spec.bidirectional_spans)
    packed = 0
    if hp.spec.is_encoder:  # no KV cache; its F16/F32 matrices are packed in their own type
        kv = 0              # and the file's pages released (engine.float_products), F16 as two
        if amx_gemm.available():  # bf16 halves where the encoder runs them on AMX tiles
            packed = amx_added_bytes(shapes)
    else:
        try:
            kv = layout.bytes_per_slot(kv_type(type_k), kv_type(type_v)) * n_slots
        except ValueError as e:  # a type the model's head dim cannot take (q8_0 needs 32s)
            raise ModelLoadError(path, f"KV cache: {e}") from e
    return (sum(os.path.getsize(f) for f in files) + kv + packed
            + estimate_repacked(shapes, host_repacks)
            + estimate_repacked_stacks(stacks, host_repacks) + merged_bytes(adapted, tensors))
