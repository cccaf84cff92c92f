"""The served model: what the registry holds for a loaded model, and the loader that makes it.

    load_served_model(entry) -> engine.load (kernels compile, KV slots) -> chat template
                             -> the entry's mmproj (engine.vision.VisionModel), if any
                             -> ServedModel(model, template) -> its Scheduler thread starts

A load that fails after the weights are mapped closes the model again, so nothing leaks.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

import engine
from engine.chat import ChatTemplate, ChatTemplateError
from engine.chat_formats import TemplateChoice, choose_template
from engine.draft import Drafter, NgramConfig, NgramDrafter
from engine.draft_model import DraftModel
from engine.gguf import ModelLoadError
from engine.kv import KVCache
from engine.loaded import LoadedModel
from engine.model import Transformer
from engine.prompt_cache import SlotFileError, restore_slot, save_slot
from engine.rerank import rerank_ids
from engine.tool_formats import ToolFormat
from engine.tool_formats import detect as detect_tool_format
from gateway.generation import defaults
from gateway.generation.events import GenerationRequest
from gateway.generation.lora_scales import LoraScales
from gateway.generation.slot_files import SlotActionError, SlotBusyError
from gateway.local.prompt_cache import fingerprint, pool_for
from gateway.local.scheduler import Generation, Scheduler
from gateway.metrics import NULL_METRICS, MetricsSink
from gateway.version import version

if TYPE_CHECKING:
    from engine.prompt_cache import PromptCachePool
    from engine.vision import VisionModel
    from gateway.config import ModelEntry
    from gateway.fleet.registry import Servable

log = logging.getLogger("modelyard.scheduler")
T = TypeVar("T")


class ServedModel:
    """What the registry holds for a loaded model: engine model + scheduler + chat template.
    The APIs see it as a GenerativeModel (gateway/generation/model.py), the registry as Loaded."""

    chat_format: str | None = None  # which template and why (chat_formats.TemplateChoice)

    def __init__(self, model: LoadedModel, template: ChatTemplate, *, name: str, max_queue: int,
                 metrics: MetricsSink = NULL_METRICS, vision: VisionModel | None = None,
                 drafts: Callable[[], Drafter | None] | None = None,
                 draft_model: engine.Model | None = None,
                 prompt_cache: PromptCachePool | None = None) -> None:
        self.model = model
        self.prompt_cache = prompt_cache  # prefixes beyond the slots (gateway/local/prompt_cache.py)
        self.vision = vision  # the entry's projector: images in (encoded on `prep`)
        # its weights are read into memory of its own: the file's size is its share
        self._vision_bytes = os.path.getsize(vision.path) if vision is not None else 0
        self.tokenizer = model.tokenizer
        self.n_ctx: int = model.n_ctx
        self.chat_template = template
        # what the GGUF recommends (general.sampling.*); requests fill unset fields from it
        self.sampling_defaults = defaults.from_metadata(model.metadata)
        self.draft_model = draft_model  # the entry's `draft.model`, closed with this one
        self.lora = LoraScales(getattr(model.transformer, "lora_scales", ()))
        self.scheduler = Scheduler(model, name=name, max_queue=max_queue, metrics=metrics,
                                   drafts=drafts, prompt_cache=prompt_cache)
        # Request preparation (template, tokenizing) is CPU work that must not block the event
        # loop; two threads per model, so one model's slow prompts never delay another's.
        self.prep = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"modelyard-{name}-prep")
        self._max_token_bytes: int | None = None
        self.fingerprint = _fingerprint(model, template)

    @property
    def n_vocab(self) -> int:
        return int(self.model.n_vocab)

    @property
    def n_embd(self) -> int:
        return int(self.model.n_embd)

    async def prepare(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` on this model's prep threads (template rendering, tokenizing). The calling
        request counts as on its way to the scheduler until it submits (gateway/local/arrivals.py)."""
        self.scheduler.arrivals.planning()
        return await asyncio.get_running_loop().run_in_executor(self.prep, fn, *args)

    def submit(self, request: GenerationRequest) -> Generation:
        return self.scheduler.submit(request)

    async def embed(self, ids: list[int]) -> np.ndarray:
        return await self.scheduler.embed(ids)

    @property
    def pooling(self) -> str:
        return self.model.pooling

    @property
    def role(self) -> str:
        return self.model.role

    def rerank_prompt(self, query: str, document: str) -> list[int]:
        """(query, document) as llama-server builds a reranker's input (engine.rerank)."""
        return rerank_ids(self.tokenizer, self.model.metadata, query, document)

    @property
    def max_token_bytes(self) -> int:
        """The longest token's text in bytes: a prompt of more than n_ctx times this many bytes
        cannot fit the context, whatever it tokenizes to (computed once)."""
        if self._max_token_bytes is None:
            texts = self.model.metadata.get("tokenizer.ggml.tokens") or []
            if texts:  # a token's bytes never outnumber its text's: byte-level BPE's characters
                # stand for one byte each, SentencePiece's ▁ for a space, <0x0A> for one byte
                longest = max(len(str(t).encode()) for t in texts)
            else:      # (rendering all 49k-262k tokens instead took ~75 ms of a first request)
                tok = self.tokenizer
                longest = max((len(tok.token_bytes(i)) for i in range(self.model.n_vocab)),
                              default=1)
            self._max_token_bytes = max(1, longest)
        return self._max_token_bytes

    @property
    def memory_bytes(self) -> int:
        draft = int(self.draft_model.memory_bytes) if self.draft_model is not None else 0
        pool = self.prompt_cache.budget if self.prompt_cache is not None else 0  # it may fill
        return int(self.model.memory_bytes) + self._vision_bytes + draft + pool

    @property
    def broken(self) -> str | None:
        """Why this model must stop serving, or None (the registry unloads a broken model): its
        scheduler stopped it (non-finite logits, a file change seen mid-step), or the file
        changed under the mapping while it was idle (a stat per call)."""
        if (why := self.scheduler.broken) is not None:
            return why
        return self.file_changed()

    def abort(self, error: BaseException) -> None:
        """End every request this model runs or queues with `error` (shutdown deadline)."""
        self.scheduler.abort(error)

    def file_changed(self) -> str | None:
        """Why the model file is no longer what is mapped (a stat), or None."""
        return self.model.file_changed()

    @property
    def mapped_bytes(self) -> int:
        """The part of memory_bytes another load of the same file shares (its mapping)."""
        return int(self.model.mapped_bytes)

    def occupancy(self) -> tuple[int, int]:
        """Requests waiting for a slot and requests generating in one (the registry's rows)."""
        return self.scheduler.queued, self.scheduler.active

    def chat_prompt(self, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None = None, *, time_budget: float = 2.0,
                    max_chars: int = 64 * 1024 * 1024) -> list[int]:
        """Render the chat template (within its budget, engine/template_budget.py) and tokenize
        it, special tokens parsed as such. Call it on `prep`, not on the event loop."""
        text = self.chat_template.render(messages, add_generation_prompt=True, tools=tools,
                                         time_budget=time_budget, max_chars=max_chars)
        return self.text_prompt(text)

    @property
    def tool_format(self) -> ToolFormat:
        """How this model's template writes tool calls (engine/tool_formats.py), found once."""
        fmt = self.__dict__.get("_tool_format")
        if fmt is None:
            tok = self.tokenizer

            def control_token(text: str) -> int | None:
                token = tok.token_id(text)
                return token if token is not None and tok.is_special(token) else None

            fmt = self.__dict__["_tool_format"] = detect_tool_format(self.chat_template.source,
                                                                     control_token)
        return fmt

    def text_prompt(self, text: str) -> list[int]:
        """Tokenize a prompt; BOS is added when the model wants it and the text lacks it."""
        tok = self.tokenizer
        bos = self.chat_template.bos_token
        add_bos = bool(tok.add_bos) and not (bos and text.startswith(bos))
        return list(tok.encode(text, add_special=add_bos, parse_special=True))

    cache_fingerprint: str = ""  # what slot files are checked against (gateway/local/prompt_cache.py)

    def slot_file(self, action: str, slot: int, path: Path | None) -> tuple[int, int]:
        """llama.cpp's slot actions on an idle slot, between two scheduler steps: save and
        restore (positions, bytes), erase (positions, 0). Raises SlotBusyError while a request
        holds the slot, SlotActionError for a file that cannot be written or restored.
        Blocking: call it off the event loop."""
        cache = self.model.transformer.cache
        if not isinstance(cache, KVCache):
            raise SlotActionError("this model keeps no KV rows")
        with self.scheduler.exclusive:
            if self.scheduler.runner.slots[slot] is not None:
                raise SlotBusyError(slot)
            if action == "erase":
                n = len(cache.tokens[slot])
                cache.truncate(slot, 0)
                return n, 0
            assert path is not None
            try:
                if action == "save":
                    return save_slot(cache, slot, path, self.cache_fingerprint)
                return restore_slot(cache, slot, path, self.cache_fingerprint)
            except SlotFileError as exc:
                raise SlotActionError(str(exc)) from exc

    _closing = False

    def shrink_prompt_cache(self, nbytes: int) -> int:
        """Give back up to `nbytes` of the prompt cache's budget (memory pressure: the
        registry asks before it evicts a model); its least recently used blocks go. Returns the
        bytes given back; the budget stays lower until the model loads again. Blocking (waits
        for a step to end): call it off the event loop."""
        pool = self.prompt_cache
        if pool is None:
            return 0
        with self.scheduler.exclusive:
            if self._closing:
                return 0
            take = min(nbytes, pool.budget)
            pool.budget -= take
            pool.trim()
            return take

    def close(self) -> None:
        with self.scheduler.exclusive:
            self._closing = True  # no shrink from now on: close() spills the pool
        self.prep.shutdown(wait=True, cancel_futures=True)
        self.scheduler.close()
        if self.prompt_cache is not None:  # the scheduler stopped: its blocks go to disk
            try:
                self.prompt_cache.close()
            except Exception:  # a full disk must not keep the model from unloading
                log.exception("could not keep the prompt cache of %s", self.scheduler.name)
        self.model.close()
        if self.vision is not None:
            self.vision.close()
        if self.draft_model is not None:
            self.draft_model.close()


def _fingerprint(model: LoadedModel, template: ChatTemplate) -> str:
    """OpenAI's `system_fingerprint`: changes when what shapes the outputs does (the weights
    file, the context, the template, the engine's version), so clients can tell."""
    ours = version()
    path = model.path
    stat = path.stat() if path is not None and path.exists() else None
    parts = (ours, str(path), stat.st_size if stat else 0, stat.st_mtime_ns if stat else 0,
             model.n_ctx, getattr(template, "source", ""))
    return "fp_" + hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


def _template_for(model: LoadedModel, entry: ModelEntry) -> tuple[ChatTemplate, TemplateChoice]:
    """The entry's template (engine/chat_formats.py says which wins); a file template that does
    not compile falls back to the built-in its vocabulary suggests."""
    tok = model.tokenizer
    tokens = model.metadata.get("tokenizer.ggml.tokens") or []
    choice = choose_template(model.metadata, config_template=entry.chat_template,
                             chat_format=entry.chat_format)
    try:
        template = ChatTemplate.for_model(choice.source, tokens, tok.bos_id, tok.eos_id)
    except ChatTemplateError as exc:
        if choice.origin != "gguf":
            raise  # the config loader compiled it already: only the file's own can fail here
        meta = {k: v for k, v in model.metadata.items() if k != "tokenizer.chat_template"}
        fallback = choose_template(meta)
        choice = TemplateChoice(fallback.source, "built-in", fallback.name,
                                f"the file's chat template does not compile ({exc})")
        log.warning("%s: %s; using %s instead", model.path, exc, choice.describe())
        template = ChatTemplate.for_model(choice.source, tokens, tok.bos_id, tok.eos_id)
    return template, choice


def rope_settings(entry: ModelEntry) -> engine.RopeSettings:
    """The entry's rope keys as the engine takes them (its scaling type validated to a name)."""
    scaling = entry.rope_scaling_type
    return engine.RopeSettings(
        rope_freq_base=entry.rope_freq_base, rope_freq_scale=entry.rope_freq_scale,
        rope_scaling_type=scaling if isinstance(scaling, str) else None,
        yarn_ext_factor=entry.yarn_ext_factor, yarn_attn_factor=entry.yarn_attn_factor,
        yarn_beta_fast=entry.yarn_beta_fast, yarn_beta_slow=entry.yarn_beta_slow,
        yarn_orig_ctx=entry.yarn_orig_ctx)


def load_served_model(entry: ModelEntry, metrics: MetricsSink = NULL_METRICS) -> ServedModel:
    """The registry's loader: load the GGUF (compiling kernels) with `n_parallel` KV-cache slots
    and start its scheduler."""
    model = engine.load(entry.model, n_ctx=entry.n_ctx, n_threads=entry.n_threads,
                        n_slots=entry.n_parallel, flash_attn=entry.flash_attn,
                        images=entry.mmproj is not None, name=entry.name,
                        rope=rope_settings(entry), pooling=entry.pooling,
                        lora=[engine.LoraSpec(a.path, a.scale) for a in entry.lora],
                        type_k=entry.kv_cache_types[0], type_v=entry.kv_cache_types[1])
    vision: VisionModel | None = None
    small: engine.Model | None = None
    try:
        template, choice = _template_for(model, entry)
        log.info("%s: chat template: %s", entry.name, choice.describe())
        if entry.mmproj is not None:
            from engine.vision import VisionModel

            vision = VisionModel(entry.mmproj, n_threads=entry.n_threads)
            log.info("%s: images through %s (%s)", entry.name, entry.mmproj.name,
                     vision.hp.projector)
        drafts: Callable[[], Drafter | None] | None = None
        draft = entry.draft
        if draft is not None and draft.model is not None:
            pool = model.transformer.pool if isinstance(model.transformer, Transformer) else None
            small = engine.load(draft.model, n_ctx=entry.n_ctx, n_threads=entry.n_threads,
                                n_slots=entry.n_parallel, flash_attn=entry.flash_attn,
                                pool=pool)  # they take turns: one pool's threads for both
            if not isinstance(small.transformer, Transformer):
                raise ModelLoadError(draft.model, "a draft model must be a text generator, "
                                                  "not an embedding model")
            lender = DraftModel(small.transformer, entry.n_parallel, entry.n_ctx, draft.p_min)
            n_draft = draft.n_draft
            drafts = lambda: lender.drafter(n_draft)  # noqa: E731
            log.info("%s: drafts by %s", entry.name, draft.model.name)
        elif draft is not None:
            lookup = NgramConfig(draft.n_draft, draft.ngram_min, draft.ngram_max)
            drafts = lambda: NgramDrafter(lookup)  # noqa: E731
        served = ServedModel(model, template, name=entry.aliases[0], max_queue=entry.max_queue,
                             metrics=metrics, vision=vision, drafts=drafts, draft_model=small,
                             prompt_cache=pool_for(entry, model))
        served.chat_format = choice.describe()
        served.cache_fingerprint = fingerprint(entry, model.n_ctx)
        return served
    except BaseException:
        if vision is not None:
            vision.close()
        if small is not None:
            small.close()
        model.close()
        raise


if TYPE_CHECKING:
    def _served_model_meets_the_registry_protocol(served: ServedModel) -> Servable:
        return served
