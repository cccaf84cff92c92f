"""A small builder for textual LLVM IR: SSA names, blocks, counted loops, byte-addressed memory.

The matmul and task kernels are written as IR text through this class (pool.py writes its
functions as one IR template; ops.py and attention.py use llvmlite's ir builder instead). Pointers are opaque (`ptr`) and all address
arithmetic is `getelementptr i8` by byte offsets: no ptrtoint/inttoptr.
"""
from __future__ import annotations

from collections.abc import Callable


class IRFunction:
    """One function's textual IR: fresh SSA names, basic blocks and counted loops."""

    def __init__(self, signature: str) -> None:
        self.lines: list[str | None] = [f"define {signature} {{", "entry:"]
        self.block = "entry"
        self._n = 0

    def fresh(self, hint: str = "t") -> str:
        self._n += 1
        return f"%{hint}{self._n}"

    def let(self, rhs: str, hint: str = "t") -> str:
        name = self.fresh(hint)
        self.lines.append(f"  {name} = {rhs}")
        return name

    def do(self, stmt: str) -> None:
        self.lines.append(f"  {stmt}")

    def label(self, name: str) -> None:
        self.lines.append(f"{name}:")
        self.block = name

    def text(self) -> str:
        assert all(line is not None for line in self.lines)
        return "\n".join(self.lines) + "\n}\n"  # type: ignore[arg-type]

    def loop(self, count: str, carried: list[tuple[str, str]],
             body: Callable[[str, list[str]], list[str]]) -> list[str]:
        """for (i = 0; i < count; i++) carried = body(i, carried); returns the final values.

        The loop is top-tested, so a zero count runs no iteration.
        """
        pre = self.block
        head, inner, done = (self.fresh(h)[1:] for h in ("head", "body", "done"))
        self.do(f"br label %{head}")
        self.label(head)
        i = self.fresh("i")
        slot = len(self.lines)
        self.lines.extend([None] * (1 + len(carried)))  # phis, filled in once the body exists
        values = [self.fresh("c") for _ in carried]
        more = self.let(f"icmp ult i64 {i}, {count}")
        self.do(f"br i1 {more}, label %{inner}, label %{done}")
        self.label(inner)
        new = body(i, values)
        assert len(new) == len(carried)
        i_next = self.let(f"add i64 {i}, 1")
        latch = self.block
        self.do(f"br label %{head}")
        self.lines[slot] = f"  {i} = phi i64 [0, %{pre}], [{i_next}, %{latch}]"
        for k, ((ty, init), v, n) in enumerate(zip(carried, values, new)):
            self.lines[slot + 1 + k] = f"  {v} = phi {ty} [{init}, %{pre}], [{n}, %{latch}]"
        self.label(done)
        return values

    def each(self, count: str, body: Callable[[str], object]) -> None:
        """for (i = 0; i < count; i++) body(i): a loop that carries no values."""

        def step(i: str, _: list[str]) -> list[str]:
            body(i)
            return []

        self.loop(count, [], step)

    def loop_range(self, start: str, stop: str, body: Callable[[str], object]) -> None:
        """for (i = start; i < stop; i++) body(i); nothing when stop <= start (signed)."""
        n = self.let(f"sub i64 {stop}, {start}")
        n = self.let(f"select i1 {self.let(f'icmp sgt i64 {n}, 0')}, i64 {n}, i64 0")

        def step(k: str, _: list[str]) -> list[str]:
            body(self.add(start, k))
            return []

        self.loop(n, [], step)

    def if_then(self, cond: str, body: Callable[[], None]) -> None:
        """if (cond) body();  cond is an i1."""
        then, done = (self.fresh(h)[1:] for h in ("then", "endif"))
        self.do(f"br i1 {cond}, label %{then}, label %{done}")
        self.label(then)
        body()
        self.do(f"br label %{done}")
        self.label(done)

    def if_value(self, cond: str, ty: str, then: Callable[[], str], otherwise: str) -> str:
        """cond ? then() : otherwise, evaluating then() (e.g. a load) only when cond holds."""
        pre = self.block
        then_label, done = (self.fresh(h)[1:] for h in ("then", "endif"))
        self.do(f"br i1 {cond}, label %{then_label}, label %{done}")
        self.label(then_label)
        value = then()
        then_end = self.block
        self.do(f"br label %{done}")
        self.label(done)
        return self.let(f"phi {ty} [{value}, %{then_end}], [{otherwise}, %{pre}]")

    def select(self, cond: str, ty: str, a: str, b: str) -> str:
        return self.let(f"select i1 {cond}, {ty} {a}, {ty} {b}")

    # memory ---------------------------------------------------------------------------------
    def gep(self, base: str, offset: int | str) -> str:
        if offset == 0:
            return base
        return self.let(f"getelementptr inbounds i8, ptr {base}, i64 {offset}", "p")

    def load(self, ty: str, base: str, offset: int | str = 0, align: int = 1) -> str:
        return self.let(f"load {ty}, ptr {self.gep(base, offset)}, align {align}")

    def store(self, ty: str, value: str, base: str, offset: int | str = 0, align: int = 1) -> None:
        self.do(f"store {ty} {value}, ptr {self.gep(base, offset)}, align {align}")

    # arithmetic -----------------------------------------------------------------------------
    def mul(self, a: str, b: str | int) -> str:
        return self.let(f"mul i64 {a}, {b}")

    def add(self, a: str, b: str | int) -> str:
        return self.let(f"add i64 {a}, {b}")

    def splat_float(self, s: str, n: int = 8) -> str:
        v = self.let(f"insertelement <{n} x float> poison, float {s}, i64 0")
        return self.let(f"shufflevector <{n} x float> {v}, <{n} x float> poison, <{n} x i32> zeroinitializer")
