"""The entry points' imports with the cyclic collector paused (``grpo_lightning.import_pause``)."""

from __future__ import annotations

import gc
import sys
import types
import weakref

import pytest

from grpo_lightning import import_pause


@pytest.fixture
def unfrozen():
    """Whatever a test freezes is unfrozen after it, as at exit."""
    yield
    gc.unfreeze()


def test_the_collector_is_paused_while_importing_then_what_lives_is_frozen(unfrozen):
    assert gc.isenabled()

    class Cycle:
        pass

    garbage = Cycle()
    garbage.me = garbage  # garbage from before the block: collected, not frozen
    before = weakref.ref(garbage)
    del garbage
    frozen_before = gc.get_freeze_count()
    with import_pause.collection_paused():
        assert not gc.isenabled() and before() is None
        made = [[] for _ in range(1000)]  # what the imports make, alive after them
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen_before + 1000 and len(made) == 1000
    gc.disable()  # a collector paused before stays paused
    try:
        with import_pause.collection_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_module_imported_already_is_returned_without_freezing_anything(monkeypatch, unfrozen):
    frozen_before = gc.get_freeze_count()
    assert import_pause.import_module("json") is sys.modules["json"]
    assert gc.get_freeze_count() == frozen_before
    module = types.ModuleType("grpo_lightning_test_fresh_module")
    monkeypatch.setattr(import_pause.importlib, "import_module", lambda name: (paused.append(not gc.isenabled()), module)[1])
    paused: list[bool] = []
    assert import_pause.import_module("grpo_lightning_test_fresh_module") is module and paused == [True]
    assert gc.isenabled()
