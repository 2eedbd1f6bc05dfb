"""The error every invalid setting raises (re-exported by :mod:`grpo_lightning.training.settings`)."""


class ConfigError(ValueError):
    """An invalid setting, raised before any work is done; the message names the field and the fix."""
