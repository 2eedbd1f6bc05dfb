"""Shared by the sweep's tests."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(autouse=True)
def root_logger_restored(monkeypatch):
    """``grpo-lightning-ablate``'s main configures the root logger (a console script owns its process's
    logging) with whatever stream stderr is then, here a test's captured one that is closed after it:
    each test's changes to the root logger are undone, so no later test logs to a closed stream."""
    monkeypatch.setattr(logging.root, "handlers", list(logging.root.handlers))
    monkeypatch.setattr(logging.root, "level", logging.root.level)
