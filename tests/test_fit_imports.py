"""While Ray starts, the driver imports what the sweep would import on its own clock later."""

import inspect
import re
import sys
import threading

from hpo.fit_imports import FIT_IMPORTS, importing_in_background


def test_the_modules_are_imported_by_the_end_of_the_block_in_another_thread(tmp_path, monkeypatch):
    (tmp_path / "slow_to_import.py").write_text("import threading\nIMPORTED_BY = threading.current_thread().name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with importing_in_background(["slow_to_import"]):
        pass
    module = sys.modules.pop("slow_to_import")
    assert module.IMPORTED_BY != threading.current_thread().name


def test_a_module_that_is_not_installed_is_no_error_there():
    with importing_in_background(["no_such_package_here", "json"]):
        pass
    assert "json" in sys.modules


def test_it_imports_what_tunes_telemetry_imports_for_a_run_with_callbacks_but_not_pyplot():
    """Ray Tune imports its logger integrations to count the callbacks a run is given; a Ray
    upgrade that changes that list shows here."""
    import ray.air._internal.usage as usage

    source = inspect.getsource(usage._count_callbacks)
    integrations = set(re.findall(r"from (ray\.(?:air\.integrations|tune\.logger)\.\w+) import", source))
    assert integrations and integrations <= set(FIT_IMPORTS)
    assert "matplotlib.pyplot" not in FIT_IMPORTS  # pyplot would choose a GUI backend off the main thread
