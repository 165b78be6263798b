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
import re
from pathlib import Path
from typing import Any

STATE_PATTERN = "experiment_state-*.json"
#: Statuses of a trial that ended: a resumed run does not run it again.
ENDED = ("TERMINATED", "ERROR")
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


# Tune writes each trial's state with `json.dumps(..., indent=2)` into a JSON string of the file, so a
# top-level key of a trial's state is `\n  \"key\": ` in the file's text. A key nested deeper is
# indented further, and a user's string holding the same characters is escaped once more.
_TOP_LEVEL_ID = re.compile(r'\\n  \\"trial_id\\": \\"([^"\\]+)\\"')
_TOP_LEVEL_STATUS = re.compile(r'\\n  \\"status\\": \\"([A-Z]+)\\"')
#: How Tune ends the file: a file that does not end so was cut short.
_WHOLE_FILE_END = re.compile(r'"stats": \{[^{}]*\}\}\s*$')


def ended_trials(state_file: Path) -> set[str]:
    """The trials the saved state holds as ended (`ENDED`).

    Read from the file's text, without parsing every trial's state: at 10,000 trials the file is
    about 90 MB, and parsing it took seconds of the driver at every save. Where the text is not laid
    out as expected (a trial without exactly one top-level id and status, in that order, or a file
    that does not end as Tune ends it) the whole file is parsed instead, which raises `DAMAGED` on a
    torn one."""
    text = state_file.read_text()
    ids, statuses = list(_TOP_LEVEL_ID.finditer(text)), list(_TOP_LEVEL_STATUS.finditer(text))
    bounds = [match.start() for match in ids[1:]] + [len(text)]
    if (not ids or len(ids) != len(statuses) or not _WHOLE_FILE_END.search(text[-4096:])
            or any(not trial_id.end() < status.start() < bound for trial_id, status, bound in zip(ids, statuses, bounds))):
        return {state["trial_id"] for state in trial_states(state_file) if state["status"] in ENDED}
    return {trial_id.group(1) for trial_id, status in zip(ids, statuses) if status.group(1) in ENDED}


def trial_configs(state_file: Path, trial_ids: set[str]) -> dict[str, dict[str, Any]]:
    """The configs the saved state holds for `trial_ids` (those it lists), each decoded from its own
    trial's state where the text is laid out as Tune writes it (see `ended_trials`); the whole file
    is parsed where it is not, or where it seems not to list one of them."""
    text = state_file.read_text()
    configs: dict[str, dict[str, Any]] = {}
    decoder = json.JSONDecoder()
    try:
        for match in _TOP_LEVEL_ID.finditer(text):
            if match.group(1) in trial_ids:
                start = text.rindex('"{\\n', 0, match.end())  # the JSON string holding this trial's state
                state = json.loads(decoder.raw_decode(text, start)[0])
                if state["trial_id"] != match.group(1):
                    raise ValueError("not laid out as expected")
                configs[state["trial_id"]] = dict(state.get("config") or {})
        if len(configs) == len(trial_ids) and _WHOLE_FILE_END.search(text[-4096:]):
            return configs
    except DAMAGED:
        pass
    states = trial_states(state_file)
    return {str(state["trial_id"]): dict(state.get("config") or {}) for state in states if str(state["trial_id"]) in trial_ids}
