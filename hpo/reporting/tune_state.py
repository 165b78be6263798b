"""The one reader of Tune's saved run state, `experiment_state-<timestamp>.json` in a run's folder.

The file is Tune's private format, so its layout is known here only: a `trial_data` list with one
entry per trial, each entry the trial's state as a JSON string, or (Ray 2.x) a list of two JSON
strings, the trial's state and its run metadata. The newest file (the timestamps sort) is the
state a resumed run continues from. Readers decide what a damaged file means to them (refuse a
resume, or read it again later), so a damaged file raises OSError, ValueError, KeyError or
TypeError here: `DAMAGED`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STATE_PATTERN = "experiment_state-*.json"
#: What reading a missing, half-replaced or damaged state file raises.
DAMAGED = (OSError, ValueError, KeyError, TypeError)


def state_files(experiment: Path) -> list[Path]:
    """The run's saved states, oldest first."""
    return sorted(experiment.glob(STATE_PATTERN))


def newest_state(experiment: Path) -> Path | None:
    """The state a resumed run continues from, or None before Tune saved any."""
    states = state_files(experiment)
    return states[-1] if states else None


def trial_entries(state_file: Path) -> list[list[str]]:
    """Each trial's parts, unparsed: its state, and its run metadata where the file holds it."""
    return [entry if isinstance(entry, list) else [entry] for entry in json.loads(state_file.read_text())["trial_data"]]


def trial_states(state_file: Path) -> list[dict[str, Any]]:
    """Each trial's state (`trial_id`, `status`, `config`...)."""
    return [json.loads(parts[0]) for parts in trial_entries(state_file)]
