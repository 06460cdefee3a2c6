"""The command's time budget counts from the process start only when the process is the command:
a command invoked inside a longer process (pytest's CliRunner) would otherwise find its limit
spent before it began (a suite ten minutes in gave every in-process `solve -t 30` 0.05 s)."""

from __future__ import annotations

import time

import pytest

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


def test_a_frontier_holds_back_its_plans_and_picture(monkeypatch):
    """`frontier -o` writes a plan per point and draws a picture after its solves: at 1,024 GPUs
    and 10 levels, 1 s for the picture and 25.6 ms per plan (not one plan's 25.6 ms) are held back
    (without them `frontier -t 60` ended at 60.5 s)."""
    monkeypatch.setattr(budget, "_FROM_PROCESS_START", False)
    b = budget.CommandBudget(60.0)
    one = b.for_solver(1024, explain=False)
    frontier = b.for_solver(1024, explain=False, plans=10, picture=True)
    assert one - frontier == pytest.approx(1.0 + 9 * 1024 * 2.5e-5, abs=1e-3)
    assert budget.CommandBudget(2.0).after_solve(1024, plans=10, picture=True) == pytest.approx(0.4)  # 20 % cap
