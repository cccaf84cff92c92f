"""The loop nest every matmul kernel shares (emit_rows), and row_tiles, the callbacks for
activations stored row by row (q8_k blocks, f32 values).

    for r in [r0, r1):                      weight rows: the split across threads
        for each tile of activation rows:   TILES, largest first
            for each group of weight blocks: values = block(...)
            out[m0 + t, r] = finish(...)[t]

Weight rows are the outer loop and activation rows the inner one, taken in tiles: each weight
block is loaded and unpacked once per tile and used for all its rows, so the weights stream from
memory once per call whatever M is. A type's tiles (legacy.py, kquants.py, floats.py) supply the
callbacks. (An M > 1 GEMM with register-blocked tiles over several weight rows is a loop nest of
its own beside this one.)
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.kernels.ir.vectors import KernelFn

# Activation rows per tile, largest first: one unpacked weight block serves a tile's rows, whose
# accumulators live in registers. Every tile must lie in one group of 8 rows of the packed scales
# (tile sizes are powers of two, largest first, so each starts at a multiple of its size). Tiles of
# 2 make M = 2 and 3 share the unpacking too (Q4_1 1536x576, M = 2: 45 -> 35 us).
TILES = (8, 4, 2, 1)
NARROW_TILES = (4, 2, 1)  # without AVX-512's 32 vector registers, 8 rows' accumulators spill
PREFETCH_BYTES = 1024  # how far ahead in the weight row to prefetch
# weight rows one pass over the activation tiles takes when M is more than one tile (emit_rows;
# 16 measured a little faster than 8 and 4: their weights stay in L1/L2 while a tile is reused)
BLOCK_ROWS = 16
# weight rows a decode (M = 1) call takes side by side, per tile family (emit_rows' row_group)
ROW_GROUP: dict[str, int] = {"legacy": 2}


@dataclass(frozen=True)
class Tile:
    """Activation rows m0 .. m0 + rows - 1, taken together against one weight row."""
    m0: str  # i64 SSA value
    rows: int


# A weight type's loop body, as three callbacks of emit_rows:
#   accs(rows)                        the (type, initial value) of a tile's loop-carried values
#   block(w blocks, block indices, tile, values) -> values     one group of weight blocks
#   finish(weight row, tile, values) -> one float per tile row
Accs = Callable[[int], list[tuple[str, str]]]
Block = Callable[[list[str], list[str], Tile, list[str]], list[str]]
Finish = Callable[[str, Tile, list[str]], list[str]]
Prologue = Callable[[str, Tile], None]  # (weight row, tile), before the tile's block loop


@dataclass(frozen=True)
class RowCallbacks:
    """What a type's tiles give emit_rows."""
    accs: Accs
    block: Block
    finish: Finish
    prologue: Prologue | None = None


def row_tiles(f: KernelFn, *, x_base: str, x_row_bytes: str, x_block_bytes: int,
              acc_types: tuple[str, ...],
              block: Callable[[list[str], list[list[str]], list[list[str]]], list[list[str]]],
              finish: Callable[[list[str], str, str], str]) -> tuple[Accs, Block, Finish]:
    """Callbacks for activations stored row by row (q8_k blocks, or f32 values): each tile row
    keeps its own accumulators (acc_types); block(w blocks, x blocks per row, accs per row) and
    finish(row's accs, weight row, x row) work row by row."""
    k = len(acc_types)

    def accs(rows: int) -> list[tuple[str, str]]:
        return [(ty, "zeroinitializer") for _ in range(rows) for ty in acc_types]

    def x_rows(tile: Tile) -> list[str]:
        return [f.gep(x_base, f.mul(f.add(tile.m0, t), x_row_bytes)) for t in range(tile.rows)]

    def tile_block(wbs: list[str], idx: list[str], tile: Tile, values: list[str]) -> list[str]:
        xss = [[f.gep(x, f.mul(b, x_block_bytes)) for b in idx] for x in x_rows(tile)]
        per_row = [values[t * k:(t + 1) * k] for t in range(tile.rows)]
        return [v for row in block(wbs, xss, per_row) for v in row]

    def tile_finish(w_row: str, tile: Tile, values: list[str]) -> list[str]:
        return [finish(values[t * k:(t + 1) * k], w_row, x) for t, x in enumerate(x_rows(tile))]

    return accs, tile_block, tile_finish



# --- rows kernels -----------------------------------------------------------------------------

def emit_rows(f: KernelFn, *, n_blocks: str, w_block_bytes: int, w_row_bytes: str, group: int,
              accs: Accs, block: Block, finish: Finish, prefetch: bool,
              tiles: tuple[int, ...], prologue: Prologue | None = None,
              row_group: int = 1) -> None:
    """The shared loop nest, writing out[m * N + r]:

        for r in [r0, r1):                          weight rows (the split across threads)
            for each tile of tiles[0] activation rows, then of tiles[1] in what is left, ...:
                prologue(w row, tile)                 (if given)
                for each group of `group` blocks, then each leftover block:
                    values = block(w[r, group], tile, values)
                out[m0 + t, r] = finish(w row, tile, values)[t]

    When M is more than one tile the weight rows go BLOCK_ROWS at a time, each block against
    every tile in turn (for block: for tile: for r in block), so a tile's activations are read
    from L1 for the block's rows rather than all M rows streaming from L2 for every weight row
    (one thread, 5632 x 2048, M = 512: Q4_K 94-98 -> 78-80 ms, Q6_K 93-96 -> 78-83 ms,
    `scripts/bench_matmul.py --shapes 1b --m 512 --threads 1`, A/B against the plain order).

    With M = 1 (decode) and row_group > 1, `row_group` weight rows share one block loop, each
    with its own values: their chains of dependent adds run side by side instead of one after
    the other (a row of 640 values is only 20 legacy blocks, too short for the core to overlap
    rows by itself). A single-row tile's prologue must keep nothing across weight rows.

    A row's arithmetic does not depend on whether it sits in a tile or beside other weight
    rows, so each output row is the same whatever else is in the batch.
    """
    n_rows = f.let("sub i64 %r1, %r0")
    # tile stages, largest first: stage i takes as many tiles of tiles[i] rows as fit in what the
    # earlier stages left (M = 7 with (4, 2, 1): one tile of 4, one of 2, one single row)
    stages: list[tuple[int, str, str]] = []  # (rows per tile, first row, tile count)
    start, left = "0", "%M"
    for size in tiles:
        count = f.let(f"udiv i64 {left}, {size}")
        stages.append((size, start, count))
        start = f.add(start, f.mul(count, size))
        left = f.let(f"sub i64 %M, {start}")
    n_groups = f.let(f"udiv i64 {n_blocks}, {group}")
    left_start = f.mul(n_groups, group)
    n_left = f.let(f"sub i64 {n_blocks}, {left_start}")

    def tile(rs: list[str], m0: str, rows: int) -> None:
        """Weight rows rs against activation rows m0 .. m0 + rows - 1, in one block loop."""
        t = Tile(m0, rows)
        w_rows = [f.gep("%w", f.mul(r, w_row_bytes)) for r in rs]
        carried = accs(rows)
        k = len(carried)

        def blocks(first: str, size: int, values: list[str]) -> list[str]:
            idx = [first if g == 0 else f.add(first, g) for g in range(size)]
            out: list[str] = []
            for j, w_row in enumerate(w_rows):
                wbs = [f.gep(w_row, f.mul(b, w_block_bytes)) for b in idx]
                if prefetch:
                    ahead = f.gep(wbs[0], PREFETCH_BYTES)
                    f.do(f"call void @llvm.prefetch.p0(ptr {ahead}, i32 0, i32 3, i32 1)")
                out += block(wbs, idx, t, values[j * k:(j + 1) * k])
            return out

        if prologue is not None:
            for w_row in w_rows:
                prologue(w_row, t)
        types = [ty for ty, _ in carried] * len(rs)
        values = f.loop(n_groups, carried * len(rs), lambda gi, v: blocks(f.mul(gi, group), group, v))
        if group > 1:
            values = f.loop(n_left, list(zip(types, values)),
                            lambda li, v: blocks(f.add(left_start, li), 1, v))
        for j, (r, w_row) in enumerate(zip(rs, w_rows)):
            for i, result in enumerate(finish(w_row, t, values[j * k:(j + 1) * k])):
                at = f.add(f.mul(f.add(m0, i), "%N"), r)
                dst = f.let(f"getelementptr inbounds float, ptr %out, i64 {at}", "p")
                f.do(f"store float {result}, ptr {dst}, align 4")

    def per_row(ri: str, _: list[str]) -> list[str]:
        r = f.add("%r0", ri)
        for size, first, count in stages:
            def tiles_of(ti: str, _: list[str], size: int = size, first: str = first) -> list[str]:
                tile([r], f.add(first, f.mul(ti, size)), size)
                return []

            f.loop(count, [], tiles_of)
        return []

    def row_blocks() -> None:
        """M > one tile: BLOCK_ROWS weight rows at a time against each activation tile, so that
        a tile's activations are reused from L1 across those rows instead of every weight row
        streaming all M rows from L2 (the rows' own arithmetic is unchanged)."""
        n_row_blocks = f.let(f"udiv i64 {f.add(n_rows, BLOCK_ROWS - 1)}, {BLOCK_ROWS}")

        def row_block(bi: str, _: list[str]) -> list[str]:
            rb = f.add("%r0", f.mul(bi, BLOCK_ROWS))
            left_rows = f.let(f"sub i64 %r1, {rb}")
            full = f.let(f"icmp sgt i64 {left_rows}, {BLOCK_ROWS}")
            n_in = f.let(f"select i1 {full}, i64 {BLOCK_ROWS}, i64 {left_rows}")
            for size, first, count in stages:
                def tiles_of(ti: str, _: list[str], size: int = size, first: str = first) -> list[str]:
                    m0 = f.add(first, f.mul(ti, size))

                    def one_row(ji: str, _: list[str]) -> list[str]:
                        tile([f.add(rb, ji)], m0, size)
                        return []

                    f.loop(n_in, [], one_row)
                    return []

                f.loop(count, [], tiles_of)
            return []

        f.loop(n_row_blocks, [], row_block)

    several_tiles = f.let(f"icmp ugt i64 %M, {tiles[0]}")
    f.if_then(several_tiles, row_blocks)
    not_several = f.let(f"xor i1 {several_tiles}, true")
    def one_tile() -> None:
        f.loop(n_rows, [], per_row)

    if row_group == 1:
        f.if_then(not_several, one_tile)
        return
    single = f.let("icmp eq i64 %M, 1")

    def decode() -> None:
        n_full = f.let(f"udiv i64 {n_rows}, {row_group}")
        rest = f.add("%r0", f.mul(n_full, row_group))

        def rows_together(gi: str, _: list[str]) -> list[str]:
            r = f.add("%r0", f.mul(gi, row_group))
            tile([r if j == 0 else f.add(r, j) for j in range(row_group)], "0", 1)
            return []

        def leftover(ri: str, _: list[str]) -> list[str]:
            tile([f.add(rest, ri)], "0", 1)
            return []

        f.loop(n_full, [], rows_together)
        f.loop(f.let(f"sub i64 %r1, {rest}"), [], leftover)

    f.if_then(single, decode)
    f.if_then(f.let(f"and i1 {f.let(f'xor i1 {single}, true')}, {not_several}"), one_tile)
