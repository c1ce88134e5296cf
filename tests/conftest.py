"""Shared fixtures: the zcluster.testing pytest plugin (real Redis servers, isolated per test by namespace)."""

from __future__ import annotations

pytest_plugins = ["zcluster.testing.plugin"]
