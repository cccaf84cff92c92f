"""Images in: llama.cpp's mmproj projector files, run on the engine's kernels.

    mmproj.py      the file: VisionParams from the header (check_header, shared with config
                   checks), the tensors as QuantMatrix / float32, resident_bytes for budgets
    preprocess.py  bytes -> RGB -> per projector resize/tile -> normalised [3, S, S] tiles
    encoder.py     the ViT (SigLIP or CLIP)
    projectors.py  gemma3, idefics3, mlp heads: ViT rows -> the text model's embedding rows
    layout.py      mtmd's marker tokens around each image chunk: text + images -> a Prompt
    model.py       VisionModel: one image -> its chunks (rows + markers), content-keyed
"""
import os

from engine.kernels import amx_gemm
from engine.vision.mmproj import PROJECTORS, Projector, VisionParams, check_header, resident_bytes
from engine.vision.model import ImageChunk, VisionModel
from engine.vision.preprocess import ImageError


def projector_memory(path: str | os.PathLike[str]) -> int:
    """Bytes a VisionModel of this file holds on this machine (AMX packing where it runs)."""
    return resident_bytes(path, amx_gemm.available())


__all__ = ["PROJECTORS", "ImageChunk", "ImageError", "Projector", "VisionModel", "VisionParams",
           "check_header", "projector_memory"]
