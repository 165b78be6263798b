"""`hpo --help` is instant because it imports no engine; a sweep of a function trainable imports
no torch; every argument explains itself; help shows no developer notes; `hpo --version` answers."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from patience import patience

from hpo.cli import ENGINE_COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("ray", "torch", "sklearn", "pandas", "scipy", "optuna", "mup", "matplotlib", "scheduler_bridge")


def modules_loaded_by(argv: list[str]) -> list[str]:
    probe = (
        "import sys\nfrom hpo.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, cwd=ROOT, timeout=patience(120))
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["validate", "--help"], ["--version"]])
def test_help_and_version_import_no_engine(argv):
    assert modules_loaded_by(argv) == "[]"


def test_the_driver_of_a_function_trainable_sweep_imports_no_torch():
    """Every `hpo run` and `--resume` of a plain Tune function would pay torch's import (seconds on
    2 cores) for engines it never uses; a Workload's sweep loads them when it is built."""
    probe = "import sys, hpo.cli, hpo.tuner.sweep, hpo.tuner.tuner\nprint('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=patience(300))
    assert proc.stdout.split() == ["False"], proc.stderr[-2000:]


def test_version_names_the_installed_package(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("hpo (hydro-hpo) ")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _parsers_under(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """`parser` and every sub-subcommand's parser below it (`hpo job submit`), with its command line."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers_under(child, f"{path} {name}")


def _command_parser(command: str) -> argparse.ArgumentParser:
    """The parser `hpo COMMAND` parses with: hpo's own, or the engine's, built as `hpo` builds it."""
    if command not in ENGINE_COMMANDS:
        return _subparsers(build_parser())[command]
    register, _, _ = ENGINE_COMMANDS[command]
    root = argparse.ArgumentParser(prog="hpo")
    register(root.add_subparsers())
    return _subparsers(root)[command]


@pytest.mark.parametrize("command", sorted(["run", "validate", "results", "coord-check", *ENGINE_COMMANDS]))
def test_every_argument_of_every_subcommand_has_help(command):
    missing = [
        f"{path} {action.option_strings[0] if action.option_strings else action.dest}"
        for path, parser in _parsers_under(_command_parser(command), f"hpo {command}")
        for action in parser._actions
        if not action.help and not isinstance(action, argparse._SubParsersAction)
    ]
    assert not missing, f"no help for: {', '.join(missing)}"


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
