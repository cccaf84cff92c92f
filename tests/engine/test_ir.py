"""engine.kernels.ir: the one intrinsics table and the modules both matmul families declare from it."""
from __future__ import annotations

import re

import llvmlite.binding as llvm
import pytest

from engine.formats.ggml_types import GGMLQuantizationType as T
from engine.kernels import gemm
from engine.kernels.gemm import build as gemm_build
from engine.kernels.ir.intrinsics import INTRINSICS, declarations
from engine.kernels.matmul import build as matmul_build
from engine.kernels.matmul import build_matmul_ir


def _declared(text: str) -> list[str]:
    return re.findall(r"^declare [^@]*@([\w.]+)\(", text, re.M)


def _called(text: str) -> set[str]:
    return set(re.findall(r"call [^@]*@(llvm\.[\w.]+)\(", text))


def test_every_declaration_in_the_table_parses() -> None:
    module = llvm.parse_assembly(declarations(*INTRINSICS))
    assert sorted(f.name for f in module.functions) == sorted(INTRINSICS)


def test_declarations_are_the_named_ones_in_their_order() -> None:
    names = ("llvm.fma.v16f32", "llvm.prefetch.p0")
    assert _declared(declarations(*names)) == list(names)
    with pytest.raises(KeyError):
        declarations("llvm.not.an.intrinsic")


@pytest.mark.parametrize("family, names", [("matmul", matmul_build.INTRINSICS),
                                           ("gemm", gemm_build.INTRINSICS)])
def test_a_family_declares_each_intrinsic_once(family: str, names: tuple[str, ...]) -> None:
    assert len(set(names)) == len(names), family


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q6_K, T.IQ4_XS, T.F16])
@pytest.mark.parametrize("isa", ["vnni512", "avx2", "portable"])
def test_every_intrinsic_a_module_calls_is_declared(qtype: T, isa: str) -> None:
    texts = [build_matmul_ir(qtype, portable=isa == "portable", vnni=isa == "vnni512",
                             wide=isa == "vnni512")]
    if gemm.supported(qtype, isa):
        texts.append(gemm.build_gemm_ir(qtype, isa))
    for text in texts:
        assert _called(text) <= set(_declared(text))
        assert _called(text)  # the scan sees the calls it checks
