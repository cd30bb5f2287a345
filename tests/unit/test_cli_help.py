"""``cdc-platform --help`` shows the module docstring of cli.py, which must name every command."""

import re

from cdc_platform import cli


def test_help_lists_every_command(capsys):
    assert cli.main(["no-such-command"]) == 2
    error = capsys.readouterr().err
    commands = re.findall(r"[\w-]+", error.partition("choose from")[2])
    assert commands
    listed = re.findall(r"^  ([\w-]+) ", cli.__doc__, flags=re.MULTILINE)
    assert listed == commands
