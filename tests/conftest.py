"""Shared fixtures: the zcluster.testing pytest plugin (real Redis servers, isolated per test by namespace);
the suite's `slow` marker and time budget (tests/budget.py)."""

from __future__ import annotations

pytest_plugins = ["zcluster.testing.plugin", "budget"]
