"""Every `gigatron` command resolves to a module with main(argv)."""

import importlib
import subprocess
import sys

import pytest

from gigatron.cli import COMMANDS, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_module_has_main(name):
    module = importlib.import_module(COMMANDS[name][0])
    assert callable(module.main)


def test_unknown_command_is_an_error(capsys):
    assert main(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err


def test_bare_train_says_what_to_pass_before_importing_torch():
    code = (
        "import sys\nfrom gigatron.cli import main\nrc = main(['train'])\n"
        "print(rc, 'torch' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.stdout.split() == ["2", "False"], (r.stdout, r.stderr[-2000:])
    assert r.stderr.count("\n") == 1 and "about 2 minutes on 2 CPU cores" in r.stderr, r.stderr
