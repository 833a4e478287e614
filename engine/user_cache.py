"""The lab's user cache directory: downloaded and converted models, the CPU kernels' builds, vLLM's
environment and the simulator's calibration. Standard library and platformdirs only, so every layer
may ask for it."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

CACHE_ENV_VAR = "PAGEDATTENTION_LAB_CACHE"


def cache_dir() -> Path:
    """The directory holding downloads and converted models (``$PAGEDATTENTION_LAB_CACHE`` wins)."""
    override = os.environ.get(CACHE_ENV_VAR)
    return Path(override) if override else Path(platformdirs.user_cache_dir("pagedattention-lab"))
