"""The one IR library every kernel is written with.

Textual IR (the matmul families, the activation quantizers, the repacks, the tasks):
    text.py        IRFunction: SSA names, blocks, counted loops, byte-addressed memory
    vectors.py     KernelFn: IRFunction plus the vector loads, splats, bit fields and sums of
                   both matmul families
    consts.py      constant vectors, splats, shuffle masks, byte literals, vector type names
    intrinsics.py  the intrinsics' declarations, one table; a module declares the ones it names
    intdot.py      the integer dot products of each ISA entry (IntOps: the row-wise family's
                   AVX2 / VNNI / portable; Dots: the interleaved family's vnni512 / avx2 /
                   portable), the same integers on every entry
    q8.py          ggml's q8 activation quantization steps, shared by both families' quantizers
llvmlite's IR builder (ops, attention, rotary):
    builder.py     counted loops, <8 x float> loads and stores, exp and tanh, reductions
"""
