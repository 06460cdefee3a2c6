"""Every command's help reads cleanly in an 80-column terminal: typer's rich help keeps a
docstring's single line breaks, so a summary that runs over two source lines is printed broken
in the command list, and a detail line longer than the terminal is wrapped into a ragged block."""

import inspect

import click
import typer

from hexiscale.cli import app

WIDTH = 76  # rich's help panel is the terminal (80) less its margins


def commands(group: click.Group, prefix: str = ""):
    for name, command in group.commands.items():
        yield f"{prefix}{name}", command
        if isinstance(command, click.Group):
            yield from commands(command, f"{prefix}{name} ")


def test_every_command_has_a_one_line_summary_and_lines_that_fit():
    found = list(commands(typer.main.get_command(app)))
    assert len(found) >= 15, [name for name, _ in found]
    for name, command in found:
        summary, *details = inspect.cleandoc(command.help or "").split("\n\n")
        assert summary and "\n" not in summary, f"{name}: summary {summary!r} spans lines"
        long = [line for part in details for line in part.splitlines() if len(line) > WIDTH]
        assert not long, f"{name}: help lines over {WIDTH} characters: {long}"
