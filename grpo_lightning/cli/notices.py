"""Notices of other packages that every run would print and that say nothing about the run:
Lightning's tips for its cloud products (``💡 Tip: ... litlogger``), and torch's deprecation of
``LeafSpec``, which Lightning's own code triggers. The project's messages and every other warning
still show.
"""

from __future__ import annotations

import logging

import lightning_utilities.core.rank_zero as rank_zero

#: Warnings raised inside other packages' code, not by anything a user set.
THIRD_PARTY_WARNINGS = (r"`isinstance\(treespec, LeafSpec\)` is deprecated",)
#: How Lightning's product tips begin.
TIP_PREFIX = "💡 Tip:"


class DropTips(logging.Filter):
    """Drops log records that are product tips (:data:`TIP_PREFIX`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(TIP_PREFIX)


def silence_tips() -> None:
    """Drop Lightning's product tips from the logger its rank-zero messages go to (once per logger)."""
    logger = rank_zero.log
    if not any(isinstance(existing, DropTips) for existing in logger.filters):
        logger.addFilter(DropTips())
