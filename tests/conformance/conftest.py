"""The conformance suite's fixture for parts a user's module registers."""

from __future__ import annotations

import sys

import pytest

from grpo_lightning.algorithms import ADVANTAGES, AGGREGATIONS, KL_PLACEMENTS, SURROGATES
from grpo_lightning.algorithms.advantages import TOKEN_STATISTICS_ADVANTAGES

USER_MODULE = "tests.conformance.user_parts"


@pytest.fixture
def user_parts():
    """The import path of ``tests/conformance/user_parts.py``, not imported yet: an option that names
    it imports it and so registers its parts. Afterwards the registries are as they were, and the
    module is forgotten (the next import registers again), so no other test sees a part it did not ask for."""
    registries = (ADVANTAGES, AGGREGATIONS, SURROGATES, KL_PLACEMENTS)
    saved = [(dict(registry), dict(registry.sources)) for registry in registries]
    scaled = {name: dict(forms) for name, forms in ADVANTAGES.scaled.items()}
    token_statistics = set(TOKEN_STATISTICS_ADVANTAGES)
    sys.modules.pop(USER_MODULE, None)
    yield USER_MODULE
    sys.modules.pop(USER_MODULE, None)
    for registry, (parts, sources) in zip(registries, saved):
        registry.clear()
        registry.update(parts)
        registry.sources = sources
    ADVANTAGES.scaled = scaled
    TOKEN_STATISTICS_ADVANTAGES.clear()
    TOKEN_STATISTICS_ADVANTAGES.update(token_statistics)
