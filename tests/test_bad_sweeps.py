"""Every malformed sweep file in tests/bad_sweeps/ is refused before Ray starts, the way a user
can act on: exit status 2, one line naming the file, the line, the key and the problem, no
traceback and no hang. The expected text is the first line of each file (`# expect: ...`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from patience import patience

from hpo.cli import main

CORPUS = Path(__file__).resolve().parent / "bad_sweeps"
FILES = sorted(CORPUS.glob("*.yaml"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A copy of the corpus with its deliberately unparsable module given its `.py` name."""
    folder = tmp_path_factory.mktemp("bad_sweeps")
    shutil.copytree(CORPUS, folder, dirs_exist_ok=True)
    for text in folder.glob("*.py.txt"):
        text.rename(text.with_suffix(""))
    return folder


def expectation(path: Path) -> str:
    first = path.read_bytes().split(b"\n", 1)[0].decode()
    assert first.startswith("# expect: "), f"{path.name} must start with '# expect: ...'"
    return first.removeprefix("# expect: ")


def test_the_corpus_covers_every_reported_kind_of_bad_sweep():
    assert len(FILES) >= 30


@pytest.mark.parametrize("command", [["validate"], ["run", "--dry-run"]], ids=["validate", "run"])
@pytest.mark.parametrize("name", [path.name for path in FILES])
def test_malformed_sweep_is_one_line_with_file_key_and_exit_2(corpus, capsys, name, command):
    path = corpus / name
    started = time.perf_counter()
    code = main([*command, str(path)])
    elapsed = time.perf_counter() - started
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, f"exit {code}, stderr: {captured.err}"
    assert "\n" not in err, f"more than one line:\n{captured.err}"
    assert err.startswith(f"error: {path}"), err
    assert expectation(path) in err, err
    assert "Traceback" not in captured.err + captured.out
    assert elapsed < 30, f"took {elapsed:.1f} s: a malformed file must fail fast, not hang"
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


def test_errors_name_the_line_of_the_key(corpus, capsys):
    main(["validate", str(corpus / "duplicate-parameter.yaml")])
    assert "duplicate-parameter.yaml:6: parameters.lr:" in capsys.readouterr().err


def test_non_utf8_file_names_the_line_of_the_bad_byte(corpus, capsys):
    main(["validate", str(corpus / "not-utf8.yaml")])
    assert "not-utf8.yaml:6:" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["billion-laughs.yaml", "not-utf8.yaml", "trainable-syntax-error.yaml"])
def test_a_real_process_prints_no_traceback(corpus, name):
    proc = subprocess.run(
        [sys.executable, "-m", "hpo.cli", "validate", str(corpus / name)], capture_output=True, text=True, timeout=patience(60)
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_a_file_larger_than_any_sweep_is_refused_unread(tmp_path, capsys):
    path = tmp_path / "huge.yaml"
    path.write_text("# padding\n" * 200_000)
    assert main(["validate", str(path)]) == 2
    assert "a sweep file is at most 1024 KiB" in capsys.readouterr().err
