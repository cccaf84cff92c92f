"""The registry owns the models: which alias is served where, and each local model's life.

    core.py    Registry: acquire()/release(), loading, eviction, draining, the idle sweep, apply()
    slots.py   a local model's slot, the lease a request holds, the rows /admin/models shows
    errors.py  what acquiring can raise (the API maps each to an OpenAI-shaped error)
"""
from gateway.config import ModelNotFoundError

from .core import Registry
from .errors import ModelLoadFailedError, PinnedLoadError, RegistryBusyError
from .slots import ApplyResult, Lease, Loaded, ModelRow

__all__ = ["ApplyResult", "Lease", "Loaded", "ModelLoadFailedError", "ModelNotFoundError",
           "ModelRow", "PinnedLoadError", "Registry", "RegistryBusyError"]
