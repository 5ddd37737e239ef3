"""Every `gigatron` command resolves to a module with main(argv)."""

import importlib

import pytest

from gigatron.cli import COMMANDS, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_module_has_main(name):
    module = importlib.import_module(COMMANDS[name][0])
    assert callable(module.main)


def test_unknown_command_is_an_error(capsys):
    assert main(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err
