"""A time budget and an output cap for chat templates, enforced inside jinja2's sandbox.

A template comes from a model file (or a config) we did not write, and it renders in a worker
thread. A Python thread cannot be killed, so the template has to stop itself: the environment
below checks the clock and the sizes at every place a template can spend time or memory.

- Loops: the code generator wraps every `for` iterable, so each iteration checks the deadline
  (two nested `range(99999)` loops have no call inside that could check it).
- Calls, filters, `*`, `**`, `+`, `~` and every buffer join (`set` blocks, macros, the output)
  check the deadline and measure their string result against the cap.
- Operations that could allocate a huge result in one C call are refused *before* they run:
  `'x' * n`, `n ** m`, `center`/`indent`/`wordwrap`/`ljust`/... with a width over the cap,
  `replace` and `join` whose result would exceed it, and format strings with huge widths.

The time budget runs within `budget(...)` (engine/chat.py renders every template in one); the
size cap applies always (DEFAULT_MAX_CHARS outside a budget).
"""
from __future__ import annotations

import contextlib
import functools
import math
import operator
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from jinja2 import Environment, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.nodes import EvalContext
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

DEFAULT_SECONDS = 2.0
DEFAULT_MAX_CHARS = 64 * 1024 * 1024

_PASSED = (Context, Environment, EvalContext)  # what pass_context & co. hand a filter first
_WIDTH_FILTERS = {"center", "indent", "wordwrap"}
_WIDTH_METHODS = {"center", "ljust", "rjust", "zfill", "expandtabs"}
_HUGE_WIDTH = re.compile(r"\d{9,}")  # a width of 10**8 or more in a format string


class TemplateBudgetExceeded(Exception):
    """The template ran past its time budget or built text over the size cap."""


class _Limits(threading.local):
    deadline: float = math.inf
    seconds: float = DEFAULT_SECONDS
    max_chars: int = DEFAULT_MAX_CHARS
    active: bool = False
    ticks: int = 0


_limits = _Limits()


@contextlib.contextmanager
def budget(seconds: float = DEFAULT_SECONDS, max_chars: int = DEFAULT_MAX_CHARS) -> Iterator[None]:
    """Within this block (on this thread), templates stop after `seconds` or at `max_chars`."""
    saved = (_limits.deadline, _limits.seconds, _limits.max_chars, _limits.active)
    _limits.deadline = time.monotonic() + seconds
    _limits.seconds, _limits.max_chars, _limits.active = seconds, max_chars, True
    try:
        yield
    finally:
        _limits.deadline, _limits.seconds, _limits.max_chars, _limits.active = saved


def _tick() -> None:
    _limits.ticks += 1
    if not _limits.ticks & 1023:
        # let other threads (the event loop) have the GIL now rather than at the next forced
        # switch: a template that loops for its whole budget costs them less latency
        time.sleep(0)
    if _limits.active and time.monotonic() > _limits.deadline:
        raise TemplateBudgetExceeded(
            f"the chat template ran longer than its time budget ({_limits.seconds:g} s)")


def _too_big(what: str, n: int) -> TemplateBudgetExceeded:
    return TemplateBudgetExceeded(
        f"the chat template builds {what} of {n} characters, over the cap of {_limits.max_chars}")


def _measured(value: Any) -> Any:
    if isinstance(value, str | list | tuple) and len(value) > _limits.max_chars:
        raise _too_big("a value", len(value))
    return value


def _check_args(args: Iterable[Any]) -> None:
    for arg in args:
        if isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > _limits.max_chars:
            raise TemplateBudgetExceeded(f"the chat template passes {arg}, over the size cap of "
                                         f"{_limits.max_chars}, to a function or filter")


def _precheck_replace(s: Any, old: Any, new: Any, count: Any = -1) -> None:
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
        hits = s.count(old) if old else len(s) + 1
        if isinstance(count, int) and count >= 0:
            hits = min(hits, count)
        size = len(s) + hits * (len(new) - len(old))
        if size > _limits.max_chars:
            raise _too_big("a replacement", size)


def _precheck_join(sep: Any, items: Any) -> None:
    if isinstance(sep, str) and isinstance(items, list | tuple | range):
        size = len(sep) * max(0, len(items) - 1)
        if size > _limits.max_chars:
            raise _too_big("a join", size)


def _precheck_format(fmt: Any) -> None:
    if isinstance(fmt, str) and _HUGE_WIDTH.search(fmt):
        raise TemplateBudgetExceeded("the chat template formats with a width over the size cap")


def _budgeted_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)  # keeps jinja's pass_context/pass_environment marks
    def run(*args: Any, **kwargs: Any) -> Any:
        _tick()
        values = [a for a in args if not isinstance(a, _PASSED)]  # not the context/env
        if name in _WIDTH_FILTERS:
            _check_args([*values[1:], *kwargs.values()])
        elif name == "replace" and len(values) >= 3:
            _precheck_replace(*values[:4])
        elif name == "join" and values:
            _precheck_join(values[1] if len(values) > 1 else kwargs.get("d", ""),
                           values[0] if isinstance(values[0], list | tuple | range) else None)
        elif name == "format" and values:
            _precheck_format(values[0])
        return _measured(f(*args, **kwargs))
    return run


class _BudgetCodeGenerator(CodeGenerator):
    """jinja2's code generator, with every loop iterable passed through `budget_iter`."""

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        node.iter = nodes.Call(nodes.EnvironmentAttribute("budget_iter"), [node.iter], [], None,
                               None, lineno=node.lineno)
        super().visit_For(node, frame)

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.budget_value(")
        super().visit_Concat(node, frame)
        self.write(")")


_SIZED = {operator.mul, operator.pow, operator.add}


class BudgetedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with the checks of the module docstring."""

    code_generator_class = _BudgetCodeGenerator
    intercepted_binops = frozenset({"*", "**", "+"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters = {name: _budgeted_filter(name, f) for name, f in self.filters.items()}

    # -- hooks the generated code calls -----------------------------------------------------

    @staticmethod
    def budget_iter(iterable: Any) -> Iterator[Any]:
        _tick()
        for item in iterable:
            _tick()
            yield item

    @staticmethod
    def budget_value(value: Any) -> Any:
        _tick()
        return _measured(value)

    def concat(self, parts: Iterable[str]) -> str:
        """Every buffer join (the output, `set` blocks, macros), measured as it grows."""
        collected: list[str] = []
        size = 0
        for part in parts:
            size += len(part)
            if size > _limits.max_chars:
                raise _too_big("output", size)
            collected.append(part)
        _tick()
        return "".join(collected)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _tick()
        name = getattr(__obj, "__name__", "")
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str):
            if name in _WIDTH_METHODS:
                _check_args([*args, *kwargs.values()])
            elif name == "replace" and len(args) >= 2:
                _precheck_replace(owner, *args[:3])
            elif name == "join" and args:
                items = args[0]
                _precheck_join(owner, items if isinstance(items, list | tuple | range) else None)
            elif name in ("format", "format_map"):
                _precheck_format(owner)
        return _measured(super().call(__context, __obj, *args, **kwargs))

    def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
        _tick()
        if operator_name == "*":
            for seq, n in ((left, right), (right, left)):
                if (isinstance(seq, str | list | tuple) and isinstance(n, int)
                        and len(seq) * n > _limits.max_chars):
                    raise _too_big("a repetition", len(seq) * n)
        elif (operator_name == "**" and isinstance(left, int) and isinstance(right, int)
              and right > 0 and abs(left) > 1 and right * math.log2(abs(left)) > 8 * _limits.max_chars):
            raise TemplateBudgetExceeded("the chat template computes a power over the size cap")
        return _measured(super().call_binop(context, operator_name, left, right))
