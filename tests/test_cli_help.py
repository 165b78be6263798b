"""`hpo --help` is instant because it imports no engine; every argument explains itself; help
shows no developer notes; `hpo --version` answers."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from hpo.cli import ENGINE_COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("ray", "torch", "sklearn", "pandas", "scipy", "optuna", "mup", "matplotlib", "scheduler_bridge")


def modules_loaded_by(argv: list[str]) -> list[str]:
    probe = (
        "import sys\nfrom hpo.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, cwd=ROOT, timeout=120)
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["validate", "--help"], ["--version"]])
def test_help_and_version_import_no_engine(argv):
    assert modules_loaded_by(argv) == "[]"


def test_version_names_the_installed_package(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("hpo (hydro-hpo) ")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", ["run", "validate", "coord-check"])
def test_every_argument_of_hpos_own_commands_has_help(command):
    parser = _subparsers(build_parser())[command]
    missing = [a.dest for a in parser._actions if not a.help]
    assert not missing, f"hpo {command}: no help for {missing}"


@pytest.mark.parametrize("command", sorted(ENGINE_COMMANDS))
def test_engine_help_is_for_users_not_developers(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    assert f"usage: hpo {command}" in out
    assert "Wire into" not in out and "add_" not in out and "python -m" not in out, out


def test_engine_commands_still_reject_bad_arguments_with_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sim", "--no-such-flag"])
    assert exit_info.value.code == 2
    assert "hpo sim" in capsys.readouterr().err


def test_unknown_arguments_of_hpos_own_commands_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", "sweep.yaml", "--bogus"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
