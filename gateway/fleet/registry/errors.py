"""What the registry raises: the API turns each into an OpenAI-shaped error (gateway/errors.py)."""
from __future__ import annotations

from pathlib import Path

RETRY_AFTER_SECONDS = 5.0  # what a 503 suggests: long enough for a short request to finish


class ModelLoadFailedError(Exception):
    """The model file could not be loaded (the API turns it into 500 model_load_failed)."""

    def __init__(self, path: Path | str, cause: str):
        self.path = Path(path)
        self.cause = cause
        super().__init__(f"{self.path}: {cause}")


class PinnedLoadError(Exception):
    """Start-up failed: pinned models could not load (`modelyard serve` exits with status 2)."""

    def __init__(self, reasons: list[str]):
        self.reasons = reasons
        super().__init__("; ".join(reasons))


class RegistryBusyError(Exception):
    """No model could be made ready in time (the API turns it into 503 with Retry-After)."""

    def __init__(self, message: str, retry_after: float = RETRY_AFTER_SECONDS):
        self.retry_after = retry_after
        super().__init__(message)

