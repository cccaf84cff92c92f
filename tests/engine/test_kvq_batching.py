"""A q8_0 KV cache under continuous batching (engine/batch.py): a sequence's tokens do not depend
on what else is in the batch, shared prompts copy their quantized rows, and the prompt cache
continues a slot; the expectation is the engine's one-sequence path with the same cache."""
from pathlib import Path

import pytest

import engine
from engine.batch import BatchRunner, Sequence
from engine.sampling import SamplingParams
from tests.support.batch_checks import CHAT_PROMPTS as PROMPTS
from tests.support.batch_checks import alone, assert_same_or_near_tie, run_all

GREEDY = SamplingParams(temperature=0.0)
N_NEW = 12


@pytest.fixture(scope="module")
def smol_q8(smollm2_path: Path):
    model = engine.load(smollm2_path, n_ctx=1024, n_threads=2, n_slots=4, type_k="q8_0",
                        type_v="q8_0")
    yield model
    model.close()


def _chat(model, text: str) -> list[int]:
    return list(model.tokenizer.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n",
                                       parse_special=True))


def test_batched_q8_0_decode_equals_each_sequence_alone(smol_q8):
    prompts = [_chat(smol_q8, t) for t in PROMPTS[:3]] + [_chat(smol_q8, PROMPTS[0])]  # a shared one
    expected = [alone(smol_q8, ids, GREEDY, N_NEW) for ids in prompts]
    runner = BatchRunner(smol_q8, prefill_budget=48)
    seqs = [Sequence(ids, params=GREEDY, max_tokens=N_NEW, stop_at_eog=False) for ids in prompts]
    runner.submit(seqs[0])
    runner.step()
    for seq in seqs[1:]:                   # arriving while the first runs
        runner.submit(seq)
    run_all(runner)
    runner.close()
    assert seqs[3].cached > 0              # the shared prompt's rows were copied, not recomputed
    for ids, want, seq in zip(prompts, expected, seqs):
        assert_same_or_near_tie(smol_q8, ids, want, seq.generated)
