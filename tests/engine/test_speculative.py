"""Speculative decoding in the batch runner (engine/draft.py drafts, Sampler.verify checks).

The expectation is plain decoding: greedy with a drafter must give the very tokens greedy without
one gives, alone and batched beside sequences that do not draft, on a tiny random llama, the
synthetic sliding-window gemma3 (past its ring's wrap) and the real SmolLM2 and Gemma 3. Besides
prompt lookup (which accepts only what repeats), an "oracle" drafter proposes plain decoding's
own next tokens with some corrupted, so both the accepted and the rejected paths run often. At
temperature > 0 the check is statistical: the tokens taken must follow the target's distribution
(chi-square against the exact probabilities).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from scipy.stats import chisquare

import engine
from engine.batch import BatchRunner, Sequence
from engine.constraint import TokenizerAdapter, lark_grammar
from engine.draft import NgramConfig, NgramDrafter
from engine.sampling import Sampler, SamplingParams
from tests.support.batch_checks import run_all
from tests.support.ggufgen import write_tiny_llama
from tests.support.refs import SYNTH_DIR

GREEDY = SamplingParams(temperature=0.0)


class OracleDrafter:
    """Proposes `truth`'s continuation of the context, with every `corrupt`-th token replaced."""

    def __init__(self, prompt_len: int, truth: list[int], corrupt: int, n_vocab: int) -> None:
        self.prompt_len, self.truth, self.corrupt, self.n_vocab = prompt_len, truth, corrupt, n_vocab
        self.calls = 0

    def propose(self, context: list[int], n: int) -> list[int]:
        self.calls += 1
        at = len(context) - self.prompt_len
        out = list(self.truth[at:at + min(n, 5)])
        if out and self.calls % self.corrupt == 0:
            i = self.calls % len(out)
            out[i] = (out[i] + 1) % self.n_vocab
        return out

    def close(self) -> None:
        pass


class ModeDrafter:
    """Proposes mode[last token], whatever came before."""

    def __init__(self, mode: dict[int, int]) -> None:
        self.mode = mode

    def propose(self, context: list[int], n: int) -> list[int]:
        return [self.mode[context[-1]]] if context[-1] in self.mode else []

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory):
    path = write_tiny_llama(tmp_path_factory.mktemp("spec") / "tiny.gguf", qtype=Q.Q8_0)
    with engine.load(path, n_ctx=256, n_threads=2, n_slots=4) as model:
        yield model


@pytest.fixture(scope="module")
def gemma_synth():
    with engine.load(SYNTH_DIR / "gemma3_d64_l6_swa8_q8_0.gguf", n_ctx=640, n_threads=2,
                     n_slots=3, flash_attn=False) as model:
        yield model


def _run(model: engine.Model, prompts: list[list[int]], params: SamplingParams, n_new: int,
         drafters: list[object | None]) -> list[Sequence]:
    runner = BatchRunner(model, prefill_budget=64)
    seqs = [Sequence(p, params=params, max_tokens=n_new, stop_at_eog=False,
                     drafter=d)  # type: ignore[arg-type]
            for p, d in zip(prompts, drafters)]
    for seq in seqs:
        runner.submit(seq)
    run_all(runner)
    runner.close()
    return seqs


def _repetitive(model: engine.Model, n: int, seed: int) -> list[int]:
    """A prompt that repeats a random phrase, so prompt lookup finds something."""
    phrase = np.random.default_rng(seed).integers(3, model.n_vocab, 12).tolist()
    return (phrase * (n // 12 + 1))[:n]


def _check_greedy(model: engine.Model, prompts: list[list[int]], n_new: int,
                  params: SamplingParams = GREEDY) -> None:
    plain = [s.generated for s in _run(model, prompts, params, n_new, [None] * len(prompts))]
    # prompt lookup on every other sequence (the rest decode plainly beside them)
    lookup = _run(model, prompts, params, n_new,
                  [NgramDrafter(NgramConfig(n_draft=6, ngram_min=1, ngram_max=3)) if i % 2 == 0
                   else None for i in range(len(prompts))])
    assert [s.generated for s in lookup] == plain
    oracles = [OracleDrafter(len(p), g, corrupt=3, n_vocab=model.n_vocab)
               for p, g in zip(prompts, plain)]
    checked = _run(model, prompts, params, n_new, oracles)  # type: ignore[arg-type]
    assert [s.generated for s in checked] == plain
    accepted = sum(s.draft_accepted for s in checked)
    drafted = sum(s.draft_n for s in checked)
    assert 0 < accepted < drafted  # both paths ran
    alone = _run(model, prompts[:1], params, n_new, oracles[:1])  # type: ignore[arg-type]
    assert alone[0].generated == plain[0]


def test_seeded_sampling_with_drafts_equals_it_without(llama):
    """At temperature > 0 a seeded request takes the same tokens with drafts as without (the
    verify draws what sample would, llama-server's test_with_and_without_draft), for prompt
    lookup, an oracle and a draft model."""
    from engine.draft_model import DraftModel

    params = SamplingParams(temperature=0.9, top_k=40, seed=4242)
    prompts = [_repetitive(llama, 40, s) for s in range(3)] + [[5, 9, 2, 7]]
    _check_greedy(llama, prompts, 40, params)
    plain = [s.generated for s in _run(llama, prompts, params, 30, [None] * len(prompts))]
    with engine.load(llama.path, n_ctx=256, n_threads=2, n_slots=4,
                     pool=llama.transformer.pool) as small:
        owner = DraftModel(small.transformer, n_slots=4, n_ctx=256)
        seqs = _run(llama, prompts, params, 30, [owner.drafter(5) for _ in prompts])
    assert [s.generated for s in seqs] == plain
    assert 0 < sum(s.draft_accepted for s in seqs) < sum(s.draft_n for s in seqs)


def test_greedy_with_drafts_equals_greedy_without_tiny_llama(llama):
    prompts = [_repetitive(llama, 40, s) for s in range(3)] + [[5, 9, 2, 7]]
    _check_greedy(llama, prompts, 40)


def test_greedy_with_drafts_equals_greedy_with_penalties(llama):
    params = SamplingParams(temperature=0.0, repeat_penalty=1.3, frequency_penalty=0.4,
                            presence_penalty=0.3)
    prompts = [_repetitive(llama, 30, s) for s in range(3)]
    _check_greedy(llama, prompts, 30, params)


def test_greedy_with_drafts_past_a_sliding_window_ring(gemma_synth):
    # ring 8 + 511 rows: 500 prompt tokens and 60 new ones wrap it while drafts roll back
    prompts = [_repetitive(gemma_synth, 500, 1), _repetitive(gemma_synth, 30, 2)]
    _check_greedy(gemma_synth, prompts, 60)


def test_a_grammar_opts_out_of_drafting(llama):
    grammar = TokenizerAdapter.of(llama.tokenizer).compile(lark_grammar('start: /[a-z ]{1,40}/'))
    seq = _run(llama, [_repetitive(llama, 30, 4)], GREEDY, 20,
               [NgramDrafter(NgramConfig())])[0]
    assert seq.draft_n > 0
    runner = BatchRunner(llama)
    constrained = Sequence(_repetitive(llama, 30, 4), params=GREEDY, max_tokens=20,
                           constraint=grammar, drafter=NgramDrafter(NgramConfig()))
    runner.submit(constrained)
    run_all(runner)
    assert constrained.generated and constrained.draft_n == 0


@pytest.mark.real_model
def test_greedy_with_lookup_equals_greedy_without_smollm2(smollm2_path: Path):
    with engine.load(smollm2_path, n_ctx=512, n_threads=2, n_slots=3) as model:
        text = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
        ids = model.tokenizer.encode(text * 3)
        _check_greedy(model, [ids, model.tokenizer.encode("The capital of France is")], 24)


@pytest.mark.real_model
def test_greedy_with_lookup_equals_greedy_without_gemma3(gemma3_path: Path):
    with engine.load(gemma3_path, n_ctx=512, n_threads=2, n_slots=3) as model:
        tok = model.tokenizer
        text = "for i in range(10):\n    print(i * i)\n" * 4
        _check_greedy(model, [[tok.bos_id, *tok.encode(text)],
                              [tok.bos_id, *tok.encode("Once upon a time")]], 24)


# -- temperature > 0: the distribution is the target's -----------------------------------------

def _probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The plain sampler's distribution, by counting its draws over many seeds would be slow:
    this is its definition (temperature, top-k, min-p) written out in float64."""
    z = logits.astype(np.float64) / params.temperature
    p = np.exp(z - z.max())
    if params.top_k:
        p[np.argsort(-p)[params.top_k:]] = 0.0
    p[p < params.min_p * p.max()] = 0.0
    return p / p.sum()


def _chi2(counts: np.ndarray, p: np.ndarray, n: int) -> float:
    keep = p * n >= 5
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(p[keep] * n, p[~keep].sum() * n)
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs, exp).pvalue)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.9),
                                    SamplingParams(temperature=1.3, top_k=6, min_p=0.02)])
def test_verify_draws_from_the_samplers_distribution(params):
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal(20) * 1.5).astype(np.float32)      # [n_vocab]
    p = _probs(logits, params)
    n = 6000
    for draft in (int(np.argmax(p)), int(np.argsort(p)[-3]), int(np.argmin(p))):
        counts = np.zeros(20)
        for seed in range(n):
            sampler = Sampler(SamplingParams(**{**params.__dict__, "seed": seed}))
            counts[sampler.verify(logits, draft)[0].token] += 1
        assert _chi2(counts, p, n) > 1e-3, draft


def test_speculative_tokens_follow_the_targets_distribution(llama):
    """The first two tokens of seeded generations whose drafter proposes, after t1, t2's most
    likely value (accepted often, rejected often): their joint counts against p(t1) p(t2 | t1)
    from the model's own logits."""
    params = SamplingParams(temperature=1.0, top_k=4)
    prompt = _repetitive(llama, 24, 9)
    first = llama.logits(prompt)[-1]                                   # [n_vocab]
    p1 = _probs(first, params)
    top1 = np.flatnonzero(p1)
    joint: dict[tuple[int, int], float] = {}
    mode: dict[int, int] = {}
    for t1 in top1:
        p2 = _probs(llama.logits([*prompt, int(t1)])[-1], params)
        mode[int(t1)] = int(np.argmax(p2))
        for t2 in np.flatnonzero(p2):
            joint[(int(t1), int(t2))] = float(p1[t1] * p2[t2])
    n = 1200
    keys = list(joint)
    counts = np.zeros(len(keys))
    drafted = accepted = 0
    for batch_start in range(0, n, 4):
        prompts = [prompt] * 4
        seqs = [Sequence(prompt, params=SamplingParams(**{**params.__dict__, "seed": batch_start + i}),
                         max_tokens=3, stop_at_eog=False,
                         drafter=ModeDrafter(mode))
                for i, prompt in enumerate(prompts)]
        runner = BatchRunner(llama, sample_threads=1)
        for seq in seqs:
            runner.submit(seq)
        run_all(runner)
        for seq in seqs:
            counts[keys.index((seq.generated[0], seq.generated[1]))] += 1
            drafted += seq.draft_n
            accepted += seq.draft_accepted
    assert drafted >= n and 0 < accepted < drafted  # every run checked a draft
    assert _chi2(counts, np.array([joint[k] for k in keys]), n) > 1e-3


# -- a draft model ----------------------------------------------------------------------------

@pytest.mark.parametrize("draft_seed", [0, 1])  # the model itself (all accepted), another one
@pytest.mark.parametrize("shared_pool", [False, True])  # its own threads, or the target's (served)
def test_greedy_with_a_draft_model_equals_greedy_without(llama, tmp_path: Path, draft_seed: int,
                                                         shared_pool: bool):
    from engine.draft_model import DraftModel

    path = write_tiny_llama(tmp_path / "draft.gguf", qtype=Q.Q8_0, seed=draft_seed)
    prompts = [_repetitive(llama, 30, s) for s in range(3)] + [[5, 9, 2, 7]]
    plain = [s.generated for s in _run(llama, prompts, GREEDY, 30, [None] * len(prompts))]
    pool = llama.transformer.pool if shared_pool else None
    with engine.load(path, n_ctx=256, n_threads=2, n_slots=3, pool=pool) as small:
        owner = DraftModel(small.transformer, n_slots=3, n_ctx=256)
        drafters = [owner.drafter(5) for _ in prompts]
        assert drafters[-1] is None  # three slots: the fourth sequence decodes plainly
        seqs = _run(llama, prompts, GREEDY, 30, drafters)  # type: ignore[arg-type]
        assert [s.generated for s in seqs] == plain
        drafted = sum(s.draft_n for s in seqs)
        accepted = sum(s.draft_accepted for s in seqs)
        assert drafted > 0
        assert (accepted == drafted) if draft_seed == 0 else (accepted < drafted)
        assert sorted(owner._free) == [0, 1, 2]  # every slot given back
    if shared_pool:  # closing the draft left the target's pool running
        assert not llama.transformer.pool.closed
        assert [s.generated for s in _run(llama, prompts[:1], GREEDY, 5, [None])] == [plain[0][:5]]
