"""The formats: how weights and activations are laid out in bytes, and their numpy
(de)quantization. No IR and no kernels here: engine.kernels imports these modules, never the
other way round.

    ggml_types.py    ggml's type numbers and block sizes (gguf-py's table, without importing it)
    quants.py        one record per weight type (TYPES), QuantMatrix, dequantize
    quant_legacy.py  Q4_0 .. Q8_0 blocks     quant_k.py  Q2_K .. Q6_K     quant_iq.py  IQ4_NL, IQ4_XS
    activations.py   ggml's q8_0 / q8_1 / q8_k activation blocks and the packed rows of the
                     row-wise kernels (engine.kernels.matmul)
    repack.py        the row-interleaved layouts (engine.kernels.gemm) and their activations
"""
