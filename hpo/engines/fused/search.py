"""Searching a fused sweep: Tune asks for one *group* of configurations at a time, and the user's
searcher still proposes, and learns from, every configuration on its own.

`GroupSearcher` is the searcher Tune is given. Each `suggest` draws configurations from the
user's searcher (Optuna's TPE, ...) or from the grid/random expansion of the search space
(`ConfigList`), keeps those that may share one fused model (same structural signature), and
returns them as one group config, `{"members": [...]}`. Every member's result and end is passed
on to the user's searcher under the member's own id, so TPE sees each result.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ray.tune.search import BasicVariantGenerator, Searcher
from ray.tune.utils.util import merge_dicts

from hpo.engines._base import space_constants
from hpo.engines.fused.members import MemberBook, member_ids

#: The key of a group trial's config that lists its members' configs.
MEMBERS_KEY = "members"


class ConfigList(Searcher):
    """Grid and random search for groups: the configurations Tune's own `BasicVariantGenerator`
    starts, in its order (the user's generator, with its seed and `points_to_evaluate`, or a new
    one seeded with the sweep's seed), so a sweep draws the same configurations fused or not.

    `num_samples=-1` draws without end, as Tune reads it (until the time budget or a stopper ends
    the sweep): each configuration as it is asked for, `configs` holding those drawn so far. The
    whole list was drawn up front, and Tune's generator draws none for -1: such a sweep ran nothing."""

    def __init__(self, param_space: Mapping[str, Any], num_samples: int, variants: BasicVariantGenerator):
        super().__init__()
        self.param_space, self.num_samples = dict(param_space), num_samples
        self.variants = copy.deepcopy(variants)  # the user's generator stays unused for another fit
        self.configs = [] if self.endless else list(self._draws())
        self.next = 0
        self._source: Iterator[dict[str, Any]] | None = None  # an endless list's draws, once asked for

    @property
    def endless(self) -> bool:
        return self.num_samples < 0

    def _draws(self) -> Iterator[dict[str, Any]]:
        """The configurations a fresh copy of the generator starts, in order."""
        variants = copy.deepcopy(self.variants)
        with tempfile.TemporaryDirectory() as scratch:  # Tune's experiment makes a folder of its own
            samples = sys.maxsize if self.endless else self.num_samples  # as tune.run reads -1
            spec = {"run": _configuration, "config": self.param_space, "num_samples": samples, "storage_path": scratch}
            variants.add_configurations({"configurations": spec})
        while (trial := variants.next_trial()) is not None:
            variants.on_trial_complete(trial.trial_id)  # its max_concurrent counts live trials
            yield trial.config

    def __getstate__(self) -> dict[str, Any]:
        """Tune pickles its searcher, and a generator does not pickle: a restored endless list
        draws again, past the configurations it had drawn (the same ones, with a seed)."""
        return {**self.__dict__, "_source": None}

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self.endless:  # drawn as asked for; once restored, past those drawn before (`next`)
            if self._source is None:
                self._source = itertools.islice(self._draws(), len(self.configs), None)
            while self.next >= len(self.configs):
                self.configs.append(next(self._source))
        if self.next >= len(self.configs):
            return Searcher.FINISHED
        self.next += 1
        return self.configs[self.next - 1]

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        pass

    def get_state(self) -> dict[str, Any]:
        return {"next": self.next}

    def set_state(self, state: dict[str, Any]) -> None:
        self.next = int(state["next"])


def _configuration(config: dict[str, Any]) -> None:
    """The trainable `ConfigList` names to Tune's variant generator, which only draws configurations with it."""


class GroupSearcher(Searcher):
    """Groups of up to `members_per_group` fusible configurations (see the module docstring)."""

    def __init__(
        self,
        inner: Searcher,
        param_space: Mapping[str, Any],
        members_per_group: int,
        signature: Callable[[Mapping[str, Any]], Any],
        book: MemberBook,
        num_samples: int | None,
        metric: str | None = None,
        mode: str | None = None,
    ):
        super().__init__(metric=metric, mode=mode)
        self.inner = inner
        self.param_space = dict(param_space)
        self.members_per_group = members_per_group
        self.signature = signature
        self.book = book
        self.num_samples = num_samples  # configurations to draw from `inner` (None: until it finishes)
        self.drawn = 0
        self.waiting: list[dict[str, Any]] = []  # drawn, not yet placed in a group
        self.inner_finished = False
        self.told: set[str] = set()  # members whose end the inner searcher has heard of
        self.draw_of: dict[str, str] = {}  # member id -> the id the inner searcher knows it by
        # Tune hands a searcher the search space only with a non-empty param_space, and its own is
        # empty (groups are suggested whole): the user's searcher gets the real space here.
        self.set_search_properties(metric, mode, {})

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        self._metric, self._mode = metric or self._metric, mode or self._mode
        self.inner.set_search_properties(self._metric, self._mode, self.param_space, **spec)
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        ids = iter(member_ids(trial_id, self.members_per_group * 4))
        while len(self.waiting) < self.members_per_group and not self.inner_finished:
            if self.num_samples is not None and self.drawn >= self.num_samples:
                self.inner_finished = True
                break
            # The inner searcher knows a member by the id its config was drawn under
            # (`draw_of` maps the member's own id to it once the member joins a group).
            draw_id = f"{next(ids)}_draw{self.drawn}"
            config = self.inner.suggest(draw_id)
            if config == Searcher.FINISHED:
                self.inner_finished = True
            elif config is None:
                break  # the inner searcher waits for results (its own concurrency limit)
            else:
                self.drawn += 1
                # what the space fixes, deep-merged under the suggestion as Tune merges it unfused
                self.waiting.append({"draw_id": draw_id, "config": merge_dicts(space_constants(self.param_space), config)})
        if not self.waiting:
            return Searcher.FINISHED if self.inner_finished else None
        return {MEMBERS_KEY: self._place(trial_id)}

    def _place(self, trial_id: str) -> list[dict[str, Any]]:
        """The largest set of waiting configurations that fuse together, up to a group."""
        by_signature: dict[Any, list[dict[str, Any]]] = {}
        for entry in self.waiting:
            by_signature.setdefault(self.signature(entry["config"]), []).append(entry)
        chosen = max(by_signature.values(), key=len)[: self.members_per_group]
        self.waiting = [e for e in self.waiting if all(e is not c for c in chosen)]
        for member_id, entry in zip(member_ids(trial_id, len(chosen)), chosen):
            self.draw_of[member_id] = entry["draw_id"]
        return [entry["config"] for entry in chosen]

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """Each member's result of this iteration (the group scheduler has just recorded them)."""
        iteration = result.get("training_iteration")
        for member in self.book.group(trial_id):
            if member.trial_id in self.draw_of and member.last_result.get("training_iteration") == iteration:
                self.inner.on_trial_result(self.draw_of[member.trial_id], member.last_result)
        self._tell_ended()

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        self._tell_ended()

    def _tell_ended(self) -> None:
        """Pass each member's end to the inner searcher once, whichever group it was in: the
        group scheduler ends members (stopped, diverged, finished, failed) before Tune tells
        the searcher about their group."""
        for member_id, draw_id in self.draw_of.items():
            member = self.book.members.get(member_id)
            if member is None or member.live or member_id in self.told:
                continue
            self.told.add(member_id)
            failed = member.ended == "error"
            self.inner.on_trial_complete(draw_id, None if failed else member.last_result or None, error=failed)

    def save(self, checkpoint_path: str) -> None:
        """Our state as JSON in the one file Tune names; the inner searcher's own saved state
        (whatever format it writes) travels inside it, base64-encoded."""
        inner_state = None
        if isinstance(self.inner, ConfigList):
            inner_state = self.inner.get_state()
        else:
            with tempfile.TemporaryDirectory() as directory:
                self.inner.save(os.path.join(directory, "inner"))
                inner_state = base64.b64encode(Path(directory, "inner").read_bytes()).decode()
        state = {
            "drawn": self.drawn, "waiting": self.waiting, "inner_finished": self.inner_finished,
            "told": sorted(self.told), "draw_of": self.draw_of, "inner": inner_state,
        }
        Path(checkpoint_path).write_text(json.dumps(state, default=str))

    def restore(self, checkpoint_path: str) -> None:
        state = json.loads(Path(checkpoint_path).read_text())
        self.drawn, self.waiting, self.inner_finished = state["drawn"], state["waiting"], state["inner_finished"]
        self.told, self.draw_of = set(state["told"]), dict(state["draw_of"])
        if isinstance(self.inner, ConfigList):
            self.inner.set_state(state["inner"])
        else:
            with tempfile.TemporaryDirectory() as directory:
                Path(directory, "inner").write_bytes(base64.b64decode(state["inner"]))
                self.inner.restore(os.path.join(directory, "inner"))
