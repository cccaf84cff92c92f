"""The registry owns the models: which alias is served where, and each local model's life.

    core.py       Registry: acquire()/release(), loading, eviction, draining, the idle sweep,
                  apply()
    slots.py      a local model's slot, the lease a request holds, the rows /admin/models shows
    budget.py     the slots as the eviction policy (gateway/fleet/eviction.py) sees them, its answers
                  as slots
    reconcile.py  which slots a new config continues and which retire (apply()'s diff)
    waiting.py    bounded waits: for a load, a change, a memory estimate
    errors.py     what acquiring can raise (the API maps each to an OpenAI-shaped error)
"""
from gateway.config import ModelNotFoundError
from gateway.fleet.registry.core import Registry
from gateway.fleet.registry.errors import ModelLoadFailedError, PinnedLoadError, RegistryBusyError
from gateway.fleet.registry.slots import ApplyResult, Lease, Loaded, ModelRow, Servable

__all__ = ["ApplyResult", "Lease", "Loaded", "ModelLoadFailedError", "ModelNotFoundError",
           "ModelRow", "PinnedLoadError", "Registry", "RegistryBusyError", "Servable"]
