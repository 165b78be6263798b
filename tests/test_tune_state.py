"""The one reader of Tune's saved run state (`hpo.reporting.tune_state`): the newest file is the one a resume
continues from, both layouts of a trial's entry read the same, and damage raises what readers catch."""

from __future__ import annotations

import json

import pytest

from hpo.reporting.tune_state import DAMAGED, newest_state, trial_entries, trial_states


def test_the_newest_state_is_read_whichever_layout_its_trials_have(tmp_path):
    assert newest_state(tmp_path) is None
    (tmp_path / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps({"trial_data": []}))
    alone = json.dumps({"trial_id": "a", "status": "TERMINATED"})
    with_metadata = [json.dumps({"trial_id": "b", "status": "RUNNING"}), json.dumps({"last_result": {}})]
    newest = tmp_path / "experiment_state-2026-01-02_00-00-00.json"
    newest.write_text(json.dumps({"trial_data": [alone, with_metadata]}))
    assert newest_state(tmp_path) == newest
    assert trial_entries(newest) == [[alone], with_metadata]
    assert [(t["trial_id"], t["status"]) for t in trial_states(newest)] == [("a", "TERMINATED"), ("b", "RUNNING")]


@pytest.mark.parametrize("text", ['{"trial_data": ["{\\"trial_id\\": "]}', '{"checkpoints": []}', '{"trial_data": [7]}', '{"trial'])
def test_a_damaged_state_raises_what_its_readers_catch(tmp_path, text):
    state = tmp_path / "experiment_state-2026-01-01_00-00-00.json"
    state.write_text(text)
    with pytest.raises(DAMAGED):
        trial_states(state)
