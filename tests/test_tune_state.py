"""The one reader of Tune's saved run state (`hpo.reporting.tune_state`): the newest file is the one a resume
continues from, both layouts of a trial's entry read the same, the ended trials read from the text are
the parsed ones, and damage raises what readers catch."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpo.reporting.tune_state import DAMAGED, ended_trials, newest_state, trial_configs, trial_entries, trial_states


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


def tune_layout(trials):
    """A state file as Tune writes it: each trial's state `json.dumps(..., indent=2)` inside the file."""
    entries = [[json.dumps({"trial_id": trial_id, "config": config, "status": status}, indent=2),
                json.dumps({"last_result": {"trial_id": trial_id, "status": "RUNNING"}}, indent=2)]
               for trial_id, config, status in trials]
    return json.dumps({"trial_data": entries, "runner_data": {}, "stats": {"start_time": 1.0}})


statuses = st.sampled_from(["PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERROR"])
configs = st.dictionaries(st.text(max_size=12), st.one_of(st.text(max_size=40), st.integers(), st.just('\n  "status": "TERMINATED"')), max_size=3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.from_regex(r"[a-f0-9]{5}_[0-9]{5}", fullmatch=True), configs, statuses), max_size=6))
def test_the_ended_trials_and_configs_read_from_the_text_are_those_the_parsed_state_holds(tmp_path_factory, trials):
    state = tmp_path_factory.mktemp("run") / "experiment_state-2026-01-01_00-00-00.json"
    state.write_text(tune_layout(trials))
    assert ended_trials(state) == {t["trial_id"] for t in trial_states(state) if t["status"] in ("TERMINATED", "ERROR")}
    asked = {trial_id for trial_id, _, status in trials if status == "PENDING"}
    assert trial_configs(state, asked) == {t["trial_id"]: t["config"] for t in trial_states(state) if t["trial_id"] in asked}


def test_a_state_laid_out_otherwise_is_parsed_whole_and_a_torn_one_raises(tmp_path):
    state = tmp_path / "experiment_state-2026-01-01_00-00-00.json"
    state.write_text(json.dumps({"trial_data": [json.dumps({"trial_id": "a", "status": "ERROR"})], "stats": {}}))
    assert ended_trials(state) == {"a"}  # no indentation: nothing for the text reader to go by
    assert trial_configs(state, {"a"}) == {"a": {}}
    whole = tune_layout([("a", {}, "TERMINATED"), ("b", {}, "TERMINATED")])
    state.write_text(whole[: whole.index('\\"b\\"') + 20])  # cut inside the second trial's state
    with pytest.raises(DAMAGED):
        ended_trials(state)
