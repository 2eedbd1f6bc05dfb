"""Advantage estimators of one completion each: ``rewards`` ``[P, G]`` (``P`` prompts, ``G``
completions per prompt) -> advantages ``[P, G]``. The math is :mod:`grpo_lightning.functional`'s;
here each gets the name it is selected by (``--model.advantage NAME``)."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from grpo_lightning import functional as F


def group_std(rewards: Tensor) -> Tensor:
    """GRPO (DeepSeekMath eq. 3): ``A_pi = (r_pi - mean_g r_p) / (std_g r_p + 1e-4)``, unbiased std;
    0 for a group of equal rewards. ``[P, G]`` -> ``[P, G]``, ``G >= 2``."""
    return F.group_normalized_advantages(rewards, scale="group")


def group_mean(rewards: Tensor) -> Tensor:
    """Dr. GRPO: ``A_pi = r_pi - mean_g r_p`` (no division by a std). ``[P, G]`` -> ``[P, G]``."""
    return F.group_centered_advantages(rewards)


def leave_one_out(rewards: Tensor) -> Tensor:
    """RLOO: ``A_pi = r_pi - 1/(G-1) sum_{j != i} r_pj``. ``[P, G]`` -> ``[P, G]``, ``G >= 2``."""
    return F.leave_one_out_advantages(rewards)


def batch_std(rewards: Tensor) -> Tensor:
    """REINFORCE++ with baseline: ``A'_pi = r_pi - mean_g r_p``, ``A_pi = A'_pi / std_batch(A')``
    (unbiased, over all ``P * G``; 0 everywhere when that std is 0). ``[P, G]`` -> ``[P, G]``."""
    return F.batch_normalized_advantages(rewards)


#: Name -> estimator ``rewards [P, G] -> advantages [P, G]``.
ADVANTAGES: dict[str, Callable[[Tensor], Tensor]] = {
    "group_std": group_std,
    "group_mean": group_mean,
    "leave_one_out": leave_one_out,
    "batch_std": batch_std,
}
