"""The chat message that environments, tools and chat templates exchange: ``{"role": ..., "content": ...}``."""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]
