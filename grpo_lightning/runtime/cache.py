"""The project's cache folder, where GGUF copies, compile records, warm starts and bytecode go. Its
module imports neither torch nor transformers: the entry points place their bytecode cache with it."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV_VAR = "GRPO_LIGHTNING_CACHE"


def cache_dir() -> Path:
    """The project's cache: ``$GRPO_LIGHTNING_CACHE`` if set, else ``~/.cache/grpo_lightning``."""
    return Path(os.environ.get(CACHE_ENV_VAR) or Path.home() / ".cache" / "grpo_lightning")
