"""Continuous batching over one model's KV-cache slots: many sequences, one forward pass a step.

A `BatchRunner` owns a loaded model's slots and the sequences in them. Each `step()` makes ONE
`Transformer.forward` call holding a decode token for every sequence that is generating plus
chunks of prompts still being read (`prefill_budget` tokens in all), then samples each sequence
with its own Sampler. Every matmul row and attention query is computed the same whatever else is
in the batch, so a sequence's tokens do not depend on its company, and a long prompt read in
chunks never stalls the others for more than one step.

A sequence's life (one writer: the runner, on its caller's single thread):

    waiting --admit: a free slot--> prefilling --last prompt chunk--> decoding --+
       |                              |  ^  ^                            |  ^     | eog, max_tokens
       |                              +--+  +-- rollback(all generated) -+  |     | or the slot is
       |         copy_prefix from another slot, or wait for an   rollback(n)|     | full (n_ctx)
       |         earlier sequence still reading the same prefix         +---+     v
       +------------- end(): cancelled, stop string, error -------------------> finished

Slots keep what they hold when a sequence leaves: that is the prompt cache. A prompt is an
engine.prompt.Prompt (token ids and embedding rows); slots and prompts are compared by position
keys, so an image's rows match only the same image's. A new sequence takes the free slot whose
cached keys share the longest prefix with its prompt (ties: least recently used) and evaluates
only the rest. While prefilling it also copies the longest matching prefix that ANY
other slot holds (the n choices of one prompt, a shared system prompt), and rather than compute a
prefix twice it waits for an earlier sequence that is still reading it.

Embeddings take a slot too; their chunks run in a second forward call of the same step (they need
every position's hidden state, not the last logits), and the model pools them (engine.pooling:
mean, cls, last, none, or a reranker's scores). An encoder's texts go whole into that call, all
of them at once (each token sees its whole text).
"""
from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import InitVar, dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from . import lora_side
from .batch_greedy import greedy_tokens, plain_greedy
from .constraint import Constraint, MaskFiller
from .draft import Drafter
from .kv import MAX_CHUNK
from .loaded import LoadedModel
from .model import Chunk, ContextOverflowError
from .prompt import Prompt, as_prompt, common_prefix
from .prompt_cache import PromptCachePool
from .sampling import Sampled, Sampler, SamplingParams
from .thinking_budget import ThinkingBudget

# Prompt tokens per step. A step of 128 tokens takes ~0.2 s on 2 cores, so a request arriving
# behind a long prompt waits at most about two such steps for its first token; bigger chunks
# gain little speed (the matmuls are already batched at this size).
PREFILL_BUDGET = 128
# With nothing decoding, no stream waits for a longer step: prompts that came together (eight
# chat requests of ~20 new tokens each) are read in one step, so their first tokens come
# together (one 160-token step of SmolLM2 on 2 cores: 92 ms; 128 then the rest: 76 + ~25 ms).
IDLE_PREFILL_BUDGET = 256
MIN_PREFILL = 32   # prompt tokens per step even when many sequences are decoding
MIN_SHARE = 16     # a common prefix shorter than this is computed rather than waited for
# A prompt passed over this many steps in a row is read first in the next (shortest-first alone
# could leave a long prompt waiting for as long as shorter ones keep arriving).
MAX_PASSED_OVER = 2


class State(Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    FINISHED = "finished"


@dataclass(eq=False)
class _Occupant:
    """Something that holds a slot: its prompt (a Prompt, or a plain list of token ids), where
    it is, and why it ended."""
    source: InitVar[Prompt | list[int]]
    prompt: Prompt = field(init=False)
    state: State = field(default=State.WAITING, init=False)
    slot: int = field(default=-1, init=False)
    pos: int = field(default=0, init=False)             # tokens of it held in its slot
    order: int = field(default=-1, init=False)          # admission order
    finish_reason: str | None = field(default=None, init=False)
    tag: Any = field(default=None, init=False)          # the caller's own (e.g. its job)

    def __post_init__(self, source: Prompt | list[int]) -> None:
        self.prompt = as_prompt(source)


@dataclass(eq=False)
class Sequence(_Occupant):
    """One generation: prompt in, up to `max_tokens` sampled tokens out.

    finish_reason: "stop" (end-of-generation token, its grammar complete, or end("stop")),
    "length" (max_tokens or a full slot), "cancelled", "error". A `constraint` (a grammar, see
    engine/constraint.py) limits every sampled token to what it allows; a `budget`
    (engine/thinking_budget.py) forces a thinking block's closing tag once it has run long.
    A `drafter` makes it speculative: each step evaluates the pending token and a draft of the
    next ones, and keeps what the target's sampler accepts (Sampler.verify), the same tokens
    as without, greedy or seeded. `lora`: its adapters' scales when not the merged ones (a side
    path, engine.lora_side; its slot's cached prefix is reused only at the same scales). A
    grammar or a thinking budget turns drafting off (their masks would have to be computed for
    positions not yet accepted).
    """
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 256
    stop_at_eog: bool = True
    constraint: Constraint | None = None
    budget: ThinkingBudget | None = None  # forces the thinking block closed after N tokens
    drafter: Drafter | None = None        # speculative decoding's guesses (engine/draft.py)
    speculative: bool = True              # take a drafter from the runner's `drafts` if it has one
    id_slot: int = -1                     # the slot it must run in (llama.cpp's id_slot); -1: any
    cache_prompt: bool = True             # False: read the whole prompt, reuse nothing
    cache_miss: str | None = field(default=None, init=False)  # why the prompt cache fell short
    lora: tuple[float, ...] | None = None  # its LoRA adapters' scales (None: as loaded; engine.lora_side)
    cached: int = field(default=0, init=False)          # prompt tokens reused, not evaluated
    prefill_steps: int = field(default=0, init=False)
    passed_over: int = field(default=0, init=False)     # steps in a row its prompt got no budget
    generated: list[int] = field(default_factory=list, init=False)
    pending: int | None = field(default=None, init=False)  # sampled, not yet evaluated
    draft: list[int] = field(default_factory=list, init=False)  # in this step's chunk after pending
    draft_n: int = field(default=0, init=False)          # drafted tokens the target checked
    draft_accepted: int = field(default=0, init=False)   # of them, those it kept

    def __post_init__(self, source: Prompt | list[int]) -> None:
        super().__post_init__(source)
        self.sampler = Sampler(self.params, self.prompt.token_ids())

    @property
    def prefilling(self) -> bool:
        return self.state is State.PREFILLING


@dataclass(eq=False)
class Embedding(_Occupant):
    """The model's pooling of the final hidden states over `prompt` (as Model.pooled): a vector,
    per-token vectors or rank scores, not normalised."""
    parts: list[np.ndarray] = field(default_factory=list, init=False)  # [n_i, n_embd] each
    vector: np.ndarray | None = field(default=None, init=False)        # float32 [n_embd]


Occupant = Sequence | Embedding


@dataclass
class StepResult:
    admitted: list[Occupant] = field(default_factory=list)
    progressed: list[Sequence] = field(default_factory=list)   # read prompt tokens this step
    sampled: list[tuple[Sequence, Sampled]] = field(default_factory=list)
    finished: list[Occupant] = field(default_factory=list)     # left their slot this step
    n_sequences: int = 0                                        # chunks in the forward passes
    n_tokens: int = 0
    reused_tokens: int = 0                                      # prompt tokens not evaluated


class StepError(Exception):
    """A step failed (forward pass or sampling); `occupants` were in it and have been ended
    with "error"."""

    def __init__(self, occupants: list[Occupant], cause: BaseException) -> None:
        super().__init__(f"step failed: {type(cause).__name__}: {cause}")
        self.occupants = occupants
        self.cause = cause


class BatchRunner:
    """The slots of one loaded model and the sequences in them. One thread drives it."""

    def __init__(self, model: LoadedModel, *, prefill_budget: int = PREFILL_BUDGET,
                 idle_budget: int | None = None,
                 sample_threads: int | None = None,
                 drafts: Callable[[], Drafter | None] | None = None,
                 prompt_cache: PromptCachePool | None = None) -> None:
        if prefill_budget < 1:
            raise ValueError("prefill_budget must be positive")
        self.transformer = model.transformer
        self.cache = model.transformer.cache
        self.pool = model.pool
        self.whole_embeddings = model.is_encoder
        self.n_slots: int = model.n_slots
        self.n_ctx: int = model.n_ctx
        self.n_vocab: int = model.n_vocab
        self.n_embd: int = model.n_embd
        self.eog: frozenset[int] = frozenset(model.tokenizer.eog_ids)
        self.prefill_budget = prefill_budget
        # prompt tokens of a step in which no sequence decodes (default: prefill_budget)
        self.idle_budget = max(prefill_budget, idle_budget or 0)
        self.drafts = drafts  # a drafter for each speculative sequence admitted (or None)
        self.prompt_cache = prompt_cache  # prefixes beyond the slots (engine.prompt_cache)
        self.waiting: deque[Occupant] = deque()
        self.slots: list[Occupant | None] = [None] * self.n_slots
        self._released_at = [0] * self.n_slots   # step of the last release, for LRU choice
        # the LoRA scale offsets each slot's KV rows were computed with (engine.lora_side): a
        # prefix is reused only by a sequence asking the same scales
        self._slot_lora: list[tuple[float, ...] | None] = [None] * self.n_slots
        self._steps = 0
        self._order = itertools.count()
        # Sampling a 50k vocabulary costs ~1-5 ms per sequence, mostly in numpy calls that drop
        # the GIL; the cores are idle between forward passes, so sample on all of them.
        threads = sample_threads if sample_threads is not None else getattr(model, "n_threads", 1)
        self._pool = (ThreadPoolExecutor(threads, thread_name_prefix="sample")
                      if threads > 1 else None)
        self._threads = max(1, threads)
        self._masks: MaskFiller | None = None  # made when the first constrained sequence comes

    # -- what the caller sees ----------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return bool(self.waiting) or any(o is not None for o in self.slots)

    @property
    def decoding(self) -> bool:
        """Whether some sequence is generating (a longer next step would delay its tokens)."""
        return any(isinstance(o, Sequence) and o.state is State.DECODING for o in self.slots)

    @property
    def n_active(self) -> int:
        return sum(o is not None for o in self.slots)

    def active(self) -> list[Occupant]:
        """Slot holders in admission order."""
        return sorted((o for o in self.slots if o is not None), key=lambda o: o.order)

    def occupants(self) -> Iterator[Occupant]:
        yield from self.waiting
        yield from (o for o in self.slots if o is not None)

    def check(self, occupant: Occupant) -> None:
        """Raise ValueError (ContextOverflowError) for what could never run; any thread."""
        prompt = occupant.prompt
        if not len(prompt):
            raise ValueError("no tokens to evaluate")
        limit = self.n_ctx if isinstance(occupant, Embedding) else self.n_ctx - 1
        if len(prompt) > limit:
            raise ContextOverflowError(len(prompt), self.n_ctx)
        if isinstance(occupant, Sequence) and occupant.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if isinstance(occupant, Sequence) and occupant.id_slot >= self.n_slots:
            raise ValueError(f"id_slot {occupant.id_slot} is not a slot (0..{self.n_slots - 1})")
        bad = next((t for t in prompt.token_ids() if not 0 <= t < self.n_vocab), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the vocabulary (0..{self.n_vocab - 1})")
        for _, span in prompt.embedding_spans():
            if span.n_embd != self.n_embd:
                raise ValueError(f"embedding span {span.key!r} has rows of {span.n_embd}, "
                                 f"the model {self.n_embd}")

    def submit(self, occupant: Occupant) -> None:
        """Queue it (FIFO) for a free slot."""
        self.check(occupant)
        if occupant.state is not State.WAITING or occupant.order >= 0:
            raise ValueError("already submitted")
        occupant.order = next(self._order)
        self.waiting.append(occupant)

    def end(self, occupant: Occupant, reason: str) -> None:
        """Take it out of the queue or its slot now (cancelled, stop string). Idempotent."""
        if occupant.state is State.WAITING:
            self.waiting.remove(occupant)
            occupant.state, occupant.finish_reason = State.FINISHED, reason
        elif occupant.state is not State.FINISHED:
            self._release(occupant, reason)

    def rollback(self, seq: Sequence, n: int) -> None:
        """Take back seq's last n generated tokens (a draft's rejected ones, a regeneration).

        Its slot is truncated to before the last kept token, which becomes `pending` again (or,
        when all are taken back, to before the prompt's last token, read again as a prompt
        chunk), so the next step recomputes the logits the next token is sampled from. A
        greedy sequence then generates what a fresh run does; a random one draws on from its
        RNG's state. The caller owns what it already streamed of the taken-back tokens.
        Raises ValueError for a sequence not decoding in its slot, one under a grammar (a
        grammar cannot give tokens back), or n outside 1..len(generated); RollbackError (from
        KVCache.truncate) when a sliding-window ring no longer holds the window, and then
        nothing has changed."""
        if seq.state is not State.DECODING or self.slots[seq.slot] is not seq:
            raise ValueError(f"only a decoding sequence can roll back (this one is {seq.state.value})")
        if seq.constraint is not None or seq.budget is not None:
            raise ValueError("a grammar- or budget-constrained sequence cannot roll back")
        if not 0 < n <= len(seq.generated):
            raise ValueError(f"cannot take back {n} of {len(seq.generated)} generated tokens")
        kept = len(seq.generated) - n
        pos = len(seq.prompt) + kept - 1  # the last kept position is evaluated again
        self.cache.truncate(seq.slot, pos)
        seq.sampler.forget(seq.generated[kept:])
        del seq.generated[kept:]
        seq.pos = pos
        if kept:
            seq.pending = seq.generated[-1]
        else:
            seq.pending, seq.state = None, State.PREFILLING

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- one step ----------------------------------------------------------------------------

    def step(self) -> StepResult:
        """Admit what fits, run one batched forward pass, sample. Raises StepError."""
        self._steps += 1
        result = StepResult()
        self._admit(result)
        active = self.active()

        chunks: list[Chunk] = []
        owners: list[Sequence] = []
        for occ in active:
            if isinstance(occ, Sequence) and occ.state is State.DECODING:
                assert occ.pending is not None
                occ.draft = self._draft(occ)
                chunks.append(Chunk(occ.slot, [occ.pending, *occ.draft], occ.pos,
                                    logits=1 + len(occ.draft), lora=occ.lora))
                owners.append(occ)
        budget = (max(self.prefill_budget - sum(len(c) for c in chunks), MIN_PREFILL) if chunks
                  else self.idle_budget)
        reading = []
        for occ in active:
            if isinstance(occ, Sequence) and occ.prefilling:
                before = occ.pos
                if not self._share(occ):
                    reading.append(occ)
                result.reused_tokens += occ.pos - before
        # shortest remaining prompt first: a short request behind a long one starts at once;
        # one passed over MAX_PASSED_OVER steps in a row goes first, so none starves
        for seq in sorted(reading, key=lambda s: (s.passed_over < MAX_PASSED_OVER,
                                                  len(s.prompt) - s.pos, s.order)):
            if budget <= 0:
                seq.passed_over += 1
                continue
            seq.passed_over = 0
            n = min(budget, len(seq.prompt) - seq.pos)
            n = seq.prompt.chunk_end(seq.pos, seq.pos + n) - seq.pos  # a bidirectional span whole
            last = seq.pos + n == len(seq.prompt)  # only the prompt's end needs logits
            chunks.append(Chunk(seq.slot, seq.prompt[seq.pos:seq.pos + n], seq.pos, logits=last,
                                lora=seq.lora))
            owners.append(seq)
            budget -= n
        e_chunks: list[Chunk] = []
        e_owners: list[Embedding] = []
        for occ in active:
            if isinstance(occ, Embedding):
                n = min(max(budget, MIN_PREFILL), len(occ.prompt) - occ.pos)
                n = occ.prompt.chunk_end(occ.pos, occ.pos + n) - occ.pos
                if self.whole_embeddings:  # an encoder reads a text whole
                    n = len(occ.prompt)
                e_chunks.append(Chunk(occ.slot, occ.prompt[occ.pos:occ.pos + n], occ.pos))
                e_owners.append(occ)
                budget -= n

        try:
            logits = self.transformer.forward(chunks, "last") if chunks else []
            hidden = self.transformer.forward(e_chunks, "hidden") if e_chunks else []
        except Exception as exc:
            failed: list[Occupant] = [*owners, *e_owners]
            for occ in failed:
                self._release(occ, "error")
            raise StepError(failed, exc) from exc
        result.n_sequences = len(chunks) + len(e_chunks)
        result.n_tokens = sum(len(c) for c in chunks) + sum(len(c) for c in e_chunks)

        to_sample: list[tuple[Sequence, np.ndarray]] = []
        to_verify: list[tuple[Sequence, np.ndarray]] = []
        for seq, chunk, row in zip(owners, chunks, logits):
            if seq.state is State.DECODING and seq.draft:
                seq.pending = None
                to_verify.append((seq, row))  # seq.pos moves as its tokens are taken
                continue
            seq.pos += len(chunk)
            if seq.state is State.DECODING:
                seq.pending = None
                to_sample.append((seq, row))
                continue
            seq.prefill_steps += 1
            result.progressed.append(seq)
            if seq.pos == len(seq.prompt):
                seq.state = State.DECODING
                to_sample.append((seq, row))
        try:
            samples = self._sample(to_sample)
            verified = [self._verify(seq, rows) for seq, rows in to_verify]
        except Exception as exc:  # e.g. non-finite logits: these requests fail, the model serves on
            failed_seqs: list[Occupant] = [seq for seq, _ in [*to_sample, *to_verify]]
            for occ in failed_seqs:
                self._release(occ, "error")
            raise StepError(failed_seqs, exc) from exc
        for (seq, _), sampled in zip(to_sample, samples):
            self._take(seq, sampled, result)
        for (seq, _), taken in zip(to_verify, verified):
            self._take_verified(seq, taken, result)

        for emb, chunk, h in zip(e_owners, e_chunks, hidden):
            emb.parts.append(h)
            emb.pos += len(chunk)
            if emb.pos == len(emb.prompt):
                emb.vector = self.pool(np.concatenate(emb.parts, axis=0))
                emb.parts = []
                self._release(emb, "stop")
                result.finished.append(emb)
        return result

    # -- inside a step -----------------------------------------------------------------------

    def _admit(self, result: StepResult) -> None:
        while self.waiting:
            free = [i for i, o in enumerate(self.slots) if o is None]
            if not free:
                return
            occ = self.waiting[0]
            if isinstance(occ, Sequence) and occ.id_slot >= 0:
                if occ.id_slot not in free:
                    return  # its slot is busy: it (and what queues behind it) waits, as llama.cpp
                free = [occ.id_slot]
            self.waiting.popleft()
            if isinstance(occ, Sequence):
                limit = len(occ.prompt) - 1  # evaluate at least one token: its logits come next
                keys = occ.prompt.position_keys()
                lora = self._lora_key(occ)
                scored = [(self.cache.reusable(s, occ.prompt.resume_point(
                    min(common_prefix(self.cache.tokens[s], keys), limit)))
                           if self._slot_lora[s] == lora else 0, -self._released_at[s], s)
                          for s in free]
                reuse, _, slot = max(scored)
                if not occ.cache_prompt:
                    reuse = 0
                elif self.prompt_cache is not None and lora is None:  # more than the slot holds
                    reuse, found = self.prompt_cache.take(slot, keys, limit, reuse,
                                                          occ.prompt.resume_point)
                    occ.cache_miss = found.miss
                elif self.prompt_cache is not None:  # its own scales: keep the slot's old rows
                    self.prompt_cache.save(slot)
            else:  # embeddings need every position's hidden state: nothing to reuse
                reuse, slot = 0, min(free, key=lambda s: self._released_at[s])
            self.cache.truncate(slot, reuse)  # reusable: a ring still holds the window
            occ.slot, occ.pos = slot, reuse
            occ.state = State.PREFILLING
            self.slots[slot] = occ
            self._slot_lora[slot] = self._lora_key(occ) if isinstance(occ, Sequence) else None
            if self.prompt_cache is not None:
                self.prompt_cache.foreign.discard(slot)
                if self._slot_lora[slot] is not None:
                    self.prompt_cache.foreign.add(slot)
            if isinstance(occ, Sequence):
                occ.cached = reuse
                if occ.drafter is None and occ.speculative and self.drafts is not None:
                    occ.drafter = self.drafts()  # given back when it leaves the slot
            result.admitted.append(occ)
            result.reused_tokens += reuse

    def _share(self, seq: Sequence) -> bool:
        """Copy the longest prefix of seq's prompt that another slot holds, unless seq should
        wait (True) for an earlier sequence still reading a longer common prefix."""
        if not seq.cache_prompt:
            return False
        limit = len(seq.prompt) - 1
        keys = seq.prompt.position_keys()
        for other in self.slots:
            if (isinstance(other, Sequence) and other is not seq and other.prefilling
                    and other.order < seq.order
                    and self._slot_lora[other.slot] == self._slot_lora[seq.slot]):
                shared = seq.prompt.resume_point(
                    min(common_prefix(other.prompt.position_keys(), keys), limit))
                if shared >= seq.pos + MIN_SHARE and other.pos < shared:
                    return True  # copy once it is all there, not piece by piece
        best, source = seq.pos, -1
        for s, held in enumerate(self.cache.tokens):
            if s != seq.slot and len(held) > best and self._slot_lora[s] == self._slot_lora[seq.slot]:
                n = self.cache.reusable(s, seq.prompt.resume_point(min(common_prefix(held, keys), limit)))
                if n > best:
                    best, source = n, s
        if source >= 0:
            self.cache.copy_prefix(source, seq.slot, best)
            seq.cached += best - seq.pos
            seq.pos = best
        return False

    def _lora_key(self, seq: Sequence) -> tuple[float, ...] | None:
        """What seq's KV rows depend on beyond its tokens: its adapters' scale offsets."""
        scales = getattr(self.transformer, "lora_scales", ())
        return lora_side.offsets(seq.lora, scales) if scales else None

    def _allowed(self, items: list[tuple[Sequence, np.ndarray]]) -> list[np.ndarray | None]:
        """Per item, the tokens its grammar allows (None: unconstrained), all masks of the step
        computed in one parallel call."""
        allowed: list[np.ndarray | None] = [None] * len(items)
        constrained = [i for i, (seq, _) in enumerate(items) if seq.constraint is not None]
        if constrained:
            if self._masks is None:
                self._masks = MaskFiller(self._threads)
            masks = self._masks.fill([items[i][0].constraint for i in constrained])  # type: ignore[misc]
            for i, mask in zip(constrained, masks):
                allowed[i] = mask
        for i, (seq, row) in enumerate(items):
            forced = seq.budget.forced() if seq.budget is not None else None
            if forced is not None:  # the budget's closing tag overrides what a grammar allows
                only = np.zeros(row.shape[-1], dtype=bool)
                only[forced] = True
                allowed[i] = only
        return allowed

    def _sample(self, items: list[tuple[Sequence, np.ndarray]]) -> list[Sampled]:
        """Sample each sequence: plain greedy ones by engine/batch_greedy.py (one argmax a row),
        the costly ones (random draws, logprobs) on the pool when there are several. Greedy is
        one pass over the logits (~20 us): handing it to a thread would cost more than it saves."""
        allowed = self._allowed(items)
        results: list[Sampled | None] = [None] * len(items)
        # the common case, greedy with no mask, penalties or logprobs: one argmax a row
        plain = [i for i, (seq, _) in enumerate(items)
                 if allowed[i] is None and plain_greedy(seq.params)]
        if plain:
            tokens = greedy_tokens([items[i][1] for i in plain],
                                   [items[i][0].params.logit_bias for i in plain])
            for i, token in zip(plain, tokens):
                items[i][0].sampler.accept(token)
                results[i] = Sampled(token, float("nan"))
        rest = [i for i in range(len(items)) if results[i] is None]
        costly = [i for i in rest if _costly(items[i][0].params)]
        if self._pool is None or len(costly) < 2:
            for i in rest:
                results[i] = items[i][0].sampler.sample(items[i][1], allowed[i])
            return results  # type: ignore[return-value]
        done = self._pool.map(lambda i: items[i][0].sampler.sample(items[i][1], allowed[i]),
                              costly)
        for i in rest:
            if not _costly(items[i][0].params):
                results[i] = items[i][0].sampler.sample(items[i][1], allowed[i])
        for i, sampled in zip(costly, done):
            results[i] = sampled
        return results  # type: ignore[return-value]

    def _take(self, seq: Sequence, sampled: Sampled, result: StepResult) -> None:
        if seq.stop_at_eog and sampled.token in self.eog:
            self._release(seq, "stop")
            result.finished.append(seq)
            return
        seq.generated.append(sampled.token)
        result.sampled.append((seq, sampled))
        if seq.budget is not None:
            seq.budget.consume(sampled.token)
        if seq.constraint is not None and (not seq.constraint.consume(sampled.token)
                                           or seq.constraint.done):
            self._release(seq, "stop")  # the grammar is complete: only end-of-generation follows
            result.finished.append(seq)
        elif len(seq.generated) >= seq.max_tokens or seq.pos >= self.n_ctx:
            self._release(seq, "length")  # no room to evaluate the token: the slot is full
            result.finished.append(seq)
        else:
            seq.pending = sampled.token

    def _draft(self, seq: Sequence) -> list[int]:
        """The tokens to check after seq's pending one this step: none without a drafter, under
        a grammar or budget, or where the slot or max_tokens leaves no room for them."""
        if seq.drafter is None or seq.constraint is not None or seq.budget is not None:
            return []
        # the chunk writes positions pos..pos+n; taken: up to n drafts and one token more
        room = min(self.n_ctx - 1 - seq.pos, seq.max_tokens - len(seq.generated) - 1,
                   MAX_CHUNK - 1)  # a ring rolls back at most MAX_CHUNK positions
        if room < 1:
            return []
        return seq.drafter.propose([*seq.prompt.token_ids(), *seq.generated], room)[:room]

    def _verify(self, seq: Sequence, rows: np.ndarray) -> list[Sampled]:
        """The tokens seq takes from its chunk's logits rows [1 + k, n_vocab]: the drafts the
        sampler accepts, in order, then the token it takes where it rejects one (or after the
        last draft). Plain greedy rows take batch_greedy's one argmax, as `_sample` does."""
        taken: list[Sampled] = []
        if plain_greedy(seq.params):
            bias = [seq.params.logit_bias]
            for row, drafted in zip(rows, [*seq.draft, -1]):  # row by row: a NaN past the
                token = greedy_tokens([row], bias)[0]          # rejection is never looked at
                seq.sampler.accept(token)
                taken.append(Sampled(token, float("nan")))
                if token != drafted:
                    break
            return taken
        for row, drafted in zip(rows, seq.draft):
            sampled, accepted = seq.sampler.verify(row, drafted)
            taken.append(sampled)
            if not accepted:
                return taken
        taken.append(seq.sampler.sample(rows[len(seq.draft)]))
        return taken

    def _take_verified(self, seq: Sequence, taken: list[Sampled], result: StepResult) -> None:
        """Keep the verified tokens: the slot forgets the rejected drafts' positions, then each
        token is taken as if it had been sampled in a step of its own."""
        k, pos = len(seq.draft), seq.pos
        seq.draft_n += k
        seq.draft_accepted += len(taken) - 1
        seq.draft = []
        if len(taken) < k + 1:  # positions pos..pos+len(taken)-1 hold pending and accepted drafts
            self.cache.truncate(seq.slot, pos + len(taken))
        for i, sampled in enumerate(taken):
            seq.pos = pos + 1 + i
            self._take(seq, sampled, result)
            if seq.state is State.FINISHED:
                return

    def _release(self, occ: Occupant, reason: str) -> None:
        if 0 <= occ.slot < self.n_slots and self.slots[occ.slot] is occ:
            self.slots[occ.slot] = None
            self._released_at[occ.slot] = self._steps
        occ.state, occ.finish_reason = State.FINISHED, reason
        if isinstance(occ, Sequence):
            occ.pending = None
            if occ.drafter is not None:
                occ.drafter.close()


def _costly(params: SamplingParams) -> bool:
    return params.temperature > 0.0 or params.logprobs or params.top_logprobs > 0


__all__ = ["BatchRunner", "Embedding", "IDLE_PREFILL_BUDGET", "PREFILL_BUDGET", "Sequence", "State",
           "StepError", "StepResult", "common_prefix"]
