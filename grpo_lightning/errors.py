"""The error every invalid setting raises, and ``require`` that raises it (both re-exported by :mod:`grpo_lightning.training.settings`)."""


class ConfigError(ValueError):
    """An invalid setting, raised before any work is done; the message names the field and the fix."""


def require(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(message)
