"""The GRPO family, one file per paper, each a ``GroupPolicyOptimization`` subclass.

This folder is installed as the package ``grpo_lightning.variants`` (setup.py maps it). :data:`PRESETS`
is the one list of the presets: the command line's short names (``--model dapo``), the order of a
report's arms and the checks of the shipped configs and the READMEs read it. A class loads when it is
first named (``grpo_lightning.variants.DAPO``), so reading the list imports no model code.
"""

from __future__ import annotations

import importlib
import importlib.util

if __name__ != "grpo_lightning.variants":  # the folder itself, importable as ``variants`` from a checkout's root
    raise ModuleNotFoundError(
        f"No module named {__name__!r}: the presets are grpo_lightning.variants (grpo_lightning.variants.GRPO, ...)",
        name=__name__,
    )

#: Short name -> class name, in the order of a report's tables and plots. The short name is the
#: module here (``dapo.py``), the shipped ``configs/variant/<name>.yaml``, ``--model <name>`` and a
#: sweep's ``variants: [<name>]``.
PRESETS: dict[str, str] = {
    "grpo": "GRPO",
    "dr_grpo": "DrGRPO",
    "dapo": "DAPO",
    "rloo": "RLOO",
    "gspo": "GSPO",
    "cispo": "CISPO",
    "sapo": "SAPO",
    "gmpo": "GMPO",
    "reinforce_plus_plus": "ReinforcePlusPlus",
    "clip_cov": "ClipCov",
    "kl_cov": "KLCov",
    "luspo": "LUSPO",
    "vespo": "VESPO",
    "dppo": "DPPO",
    "gpg": "GPG",
    "dro": "DRO",
    "max_rl": "MaxRL",
    "online_dpo_grpo": "OnlineDPOGRPO",
    "ppo": "PPO",
    "process_grpo": "ProcessGRPO",
    "on_policy_distillation": "OnPolicyDistillation",
}
#: The import path of the presets before 0.1.0 (a top-level package, ``variants.DAPO``).
FORMER_PACKAGE = "variants"

__all__ = list(PRESETS.values())
_MODULES = {class_name: name for name, class_name in PRESETS.items()}


def class_path(name: str) -> str:
    """The class path of the preset called ``name``: ``dapo`` -> ``grpo_lightning.variants.DAPO``."""
    return f"{__name__}.{PRESETS[name]}"


def moved_class_path(path: str) -> str | None:
    """``path`` written with the former package (``variants.DAPO``, ``variants.dapo.DAPO``) as it is
    now (``grpo_lightning.variants.DAPO``); ``None`` for any other path, and where what follows
    ``variants.`` is neither a preset nor a module here."""
    package, _, rest = path.partition(".")
    first = rest.partition(".")[0]
    if package != FORMER_PACKAGE or not first:
        return None
    return f"{__name__}.{rest}" if first in _MODULES or importlib.util.find_spec(f"{__name__}.{first}") else None


def __getattr__(name: str) -> type:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    globals()[name] = cls
    return cls


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
