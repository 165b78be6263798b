"""Where a sweep's runs live on disk, and whether a stored run can be resumed.

A run is never overwritten: a second sweep under a name already on disk gets the next free
versioned folder (`name-2`, `name-3`, ...), and `--resume` continues the newest of them. Before
Tune reads a stored run back, its experiment state is checked, so a torn write (a full disk, a
killed driver) is refused with the damaged file named instead of silently starting over.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from hpo.reporting.tune_state import DAMAGED, STATE_PATTERN, newest_state, state_files, trial_entries


class RunStateError(RuntimeError):
    """A stored run that cannot be resumed as it is; the message names the file and the fix."""


def _versions(storage: Path, name: str) -> list[tuple[int, Path]]:
    found = []
    if (storage / name).exists():
        found.append((1, storage / name))
    pattern = re.compile(rf"{re.escape(name)}-(\d+)")
    if storage.is_dir():
        for path in storage.iterdir():
            match = pattern.fullmatch(path.name)
            if match:
                found.append((int(match.group(1)), path))
    return sorted(found)


def fresh_run_name(storage: Path, name: str) -> str:
    """`name`, or the next versioned name when a run of that name is already on disk."""
    versions = _versions(storage, name)
    if not versions or (versions == [(1, storage / name)] and not any((storage / name).iterdir())):
        return name
    return f"{name}-{versions[-1][0] + 1}"


#: The file that claims a run folder for one sweep, written before Tune writes anything there.
CLAIM_FILE = ".hpo-run"


def claim_run_name(storage: Path, name: str) -> str:
    """`fresh_run_name`, with the folder claimed at once for this sweep: two sweeps of one name that
    start together in one storage path (two terminals, each with its own Ray) both found the
    name free and wrote into one folder. The claim is a file created only if absent, which
    exactly one of them creates; the other takes the next name."""
    while True:
        candidate = fresh_run_name(storage, name)
        folder = storage / candidate
        folder.mkdir(parents=True, exist_ok=True)
        try:
            os.close(os.open(folder / CLAIM_FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            continue  # another sweep claimed it first
        return candidate


def release_claim(folder: Path) -> None:
    """Give up a claimed run folder that holds nothing but the claim (the sweep was refused before
    Tune wrote anything), so a refused sweep leaves no folder behind."""
    if folder.is_dir() and [path.name for path in folder.iterdir()] == [CLAIM_FILE]:
        (folder / CLAIM_FILE).unlink()
        folder.rmdir()


def latest_run(storage: Path, name: str) -> Path | None:
    """The newest stored run of `name` (the one `--resume` continues), or None."""
    versions = _versions(storage, name)
    return versions[-1][1] if versions else None


def nothing_ran(path: Path) -> bool:
    """Whether a run folder holds neither a saved Tune state nor a trial's folder: a run stopped
    before it began, which loses nothing by being started again."""
    return not state_files(path) and not any(path.glob("*/params.json"))


def verify_run_state(path: Path) -> None:
    """Refuse a run whose Tune state is missing or damaged, naming the file; see RunStateError."""
    rebuild = f"rebuild its results from the trials' own folders with: hpo results {path} --rebuild"
    newest = newest_state(path)
    if newest is None:
        if nothing_ran(path):
            raise RunStateError(f"{path}: nothing ran in this run (it was stopped before Tune saved any state); "
                                "start the sweep again, without --resume")
        raise RunStateError(f"{path}: no {STATE_PATTERN}; this is not a resumable run ({rebuild})")
    try:
        trials = trial_entries(newest)
        for parts in trials:
            for part in parts:
                json.loads(part)
    except DAMAGED as exc:
        raise RunStateError(f"{newest}: damaged run state ({type(exc).__name__}: {exc}); {rebuild}") from None
    tuner = path / "tuner.pkl"
    if not tuner.exists() or tuner.stat().st_size == 0:
        raise RunStateError(f"{tuner}: missing or empty; {rebuild}")
    folders = len(list(path.glob("*/params.json")))
    if len(trials) < folders:  # an older state file, or one cut short: trials would be lost
        raise RunStateError(f"{newest}: lists {len(trials)} trials but {folders} trial folders exist; {rebuild}")
