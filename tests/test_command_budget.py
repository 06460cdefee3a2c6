"""The command's time budget counts from the process start only when the process is the command:
a command invoked inside a longer process (pytest's CliRunner) would otherwise find its limit
spent before it began (a suite ten minutes in gave every in-process `solve -t 30` 0.05 s)."""

from __future__ import annotations

import time

from hexiscale.cli import budget


def test_an_in_process_command_counts_from_its_call(monkeypatch):
    monkeypatch.setattr(budget, "_FROM_PROCESS_START", False)
    time.sleep(0.01)  # the process is older than the call in any case
    b = budget.CommandBudget(30.0)
    assert 29.5 < b.left() <= 30.0


def test_the_console_command_counts_its_start_up(monkeypatch):
    monkeypatch.setattr(budget, "_FROM_PROCESS_START", False)
    budget.count_from_process_start()
    age = budget.seconds_since_process_start()
    b = budget.CommandBudget(30.0)
    assert age > 0.0  # pytest's own start-up has taken time
    assert b.left() <= 30.0 - age + 1e-3
