"""Fixtures of the runs tests: the W&B environment a test sees."""

from __future__ import annotations

import os

import pytest

from tests.graph.wandb_records import no_login_environment


@pytest.fixture
def clean_wandb_environment(monkeypatch):
    """No W&B variable of the machine's reaches the test."""
    for name in list(os.environ):
        if name.startswith("WANDB_"):
            monkeypatch.delenv(name)


@pytest.fixture
def not_logged_in(tmp_path, monkeypatch, clean_wandb_environment):
    """Online W&B with no API key anywhere it looks, and a server address nothing answers."""
    (tmp_path / "home").mkdir()
    for name, value in no_login_environment(tmp_path).items():
        monkeypatch.setenv(name, value)
