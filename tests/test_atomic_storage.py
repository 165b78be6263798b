"""Tune's storage: a file is replaced whole when its writer finishes, and never by what a writer
that stopped part-way had written (a second Ctrl-C while Tune saves its state, an error in the
writer)."""

from __future__ import annotations

import pytest

from hpo.atomic_storage import atomic_local_filesystem


@pytest.fixture
def saved(tmp_path):
    target = tmp_path / "experiment_state.json"
    with atomic_local_filesystem().open_output_stream(str(target)) as stream:
        stream.write(b'{"trials": 2}')
    return target


def test_a_finished_write_replaces_the_file_and_leaves_no_temporary(saved):
    with atomic_local_filesystem().open_output_stream(str(saved)) as stream:
        stream.write(b'{"trials": ')
        stream.write(b"3}")
    assert saved.read_bytes() == b'{"trials": 3}'
    assert [p.name for p in saved.parent.iterdir()] == [saved.name]


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_a_writer_stopped_part_way_leaves_the_last_complete_file(saved, stop):
    with pytest.raises(stop):
        with atomic_local_filesystem().open_output_stream(str(saved)) as stream:
            stream.write(b'{"trials": ')
            raise stop()
    assert saved.read_bytes() == b'{"trials": 2}'
    assert [p.name for p in saved.parent.iterdir()] == [saved.name]


def test_a_file_written_while_an_error_is_handled_is_written(saved):
    try:
        raise ValueError("the trial failed")
    except ValueError:  # as a writer of error files does
        with atomic_local_filesystem().open_output_stream(str(saved)) as stream:
            stream.write(b'{"trials": 3}')
    assert saved.read_bytes() == b'{"trials": 3}'
