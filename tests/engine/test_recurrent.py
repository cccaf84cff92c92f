"""engine/recurrent.py's bookkeeping: where checkpoints are taken, which one a full slot gives
up, what a slot can go back to, and what a copy carries (the states themselves are checked
against llama.cpp's logits in tests/engine/test_qwen35.py)."""
from __future__ import annotations

import numpy as np

from engine.recurrent import RecurrentShape, RecurrentState

SHAPE = RecurrentShape(layers=(0, 2), conv_rows=3, conv_dim=4, heads=2, head_v=3, head_k=3)


def _state(**kw) -> RecurrentState:
    return RecurrentState(SHAPE, n_slots=2, **kw)


def _taken(state: RecurrentState, slot: int, pos0: int, n: int, prompt_end: bool = False) -> list[int]:
    return [pos0 + at for at, _ in state.plan(slot, pos0, n, prompt_end)]


def test_checkpoints_every_n_tokens_and_at_a_prompt_chunks_end() -> None:
    s = _state(every=10, max_checkpoints=16)
    assert _taken(s, 0, 0, 25) == [10, 20, 25]               # a prompt chunk: its end too
    assert _taken(s, 0, 25, 1) == []                         # a decode step between multiples
    assert _taken(s, 0, 29, 1) == [30]                       # ... and one that reaches one
    assert _taken(s, 0, 30, 7, prompt_end=True) == [36, 37]  # the last prompt chunk: end - 1 too
    assert s.checkpoints(0) == [10, 20, 25, 30, 36, 37]


def test_a_full_slot_gives_up_the_checkpoint_closest_to_the_one_before() -> None:
    s = _state(every=1000, max_checkpoints=3)
    for pos0, n in ((0, 40), (40, 2), (42, 30)):
        _taken(s, 0, pos0, n)
    assert s.checkpoints(0) == [40, 42, 72]
    _taken(s, 0, 72, 50)                                     # 42 is 2 after 40: it goes
    assert s.checkpoints(0) == [40, 72, 122]


def test_the_bytes_are_the_live_state_and_every_checkpoint() -> None:
    one = 4 * 2 * (3 * 4 + 2 * 3 * 3)
    assert SHAPE.state_bytes() == one
    s = _state(max_checkpoints=5)
    assert s.nbytes == 2 * 6 * one == 2 * RecurrentState.bytes_per_slot(SHAPE, 5)


def test_restore_and_copy_go_back_only_to_a_state_that_was_kept() -> None:
    s = _state(every=1000, max_checkpoints=4)
    rng = np.random.default_rng(0)
    saved = {}
    for pos0, n in ((0, 8), (8, 8)):
        for at, entry in s.plan(0, pos0, n, prompt_end=False):
            s.conv[0] = rng.standard_normal(s.conv[0].shape)
            s.ssm[0] = rng.standard_normal(s.ssm[0].shape)
            for layer in SHAPE.layers:
                s.save(0, entry, layer)
            saved[pos0 + at] = (s.conv[0].copy(), s.ssm[0].copy())
    live = s.ssm[0].copy()
    assert (s.resume_point(0, 12, held=20), s.resume_point(0, 20, held=20)) == (8, 20)
    assert s.resume_point(0, 7, held=20) == 0
    assert not s.restore(0, 12, held=20)                     # no state at 12: nothing changes
    np.testing.assert_array_equal(s.ssm[0], live)
    assert s.copy(0, 1, 16, held=20)                         # slot 1 takes slot 0's state at 16
    np.testing.assert_array_equal(s.ssm[1], saved[16][1])
    assert s.checkpoints(1) == [8, 16]
    assert s.restore(0, 8, held=20)
    np.testing.assert_array_equal(s.conv[0], saved[8][0])
    np.testing.assert_array_equal(s.ssm[0], saved[8][1])
    assert s.checkpoints(0) == [8]                            # later ones are forgotten
    assert s.restore(0, 0, held=8) and not s.ssm[0].any() and not s.conv[0].any()
