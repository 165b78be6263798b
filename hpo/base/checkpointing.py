"""Where and when a trial's state is saved, importable without torch.

Every engine writes a member's state under the same file name, so a configuration trained fused
can resume unfused and the other way round; the fused member trials, which must not import
torch, read the names from here. `checkpoint_due` is the one rule of the sweep's checkpoint
policy (`checkpoint: {every, at_end}`), applied by whichever engine trains the trial.
"""

#: A trial's state in `hpo.base.trial_state.trial_state`'s format, whichever engine wrote it (tensors and plain values
#: only, so it loads with `torch.load(weights_only=True)`).
CHECKPOINT_FILE = "trial_state.pt"
#: A fused member's position (`{"iteration": i, "step": s}`), as JSON.
PROGRESS_FILE = "member_progress.json"


def checkpoint_due(iteration: int, max_iterations: int, every: int, at_end: bool) -> bool:
    """Whether iteration `iteration` (1-based) is checkpointed: a crash then costs a trial at
    most `every` iterations, and `at_end` keeps the final state (the one a user deploys)."""
    return iteration % every == 0 or (at_end and iteration >= max_iterations)


#: Checkpoints a trial keeps when it writes many: the newest two, enough to resume either way.
KEEP_NEWEST = 2
#: The most checkpoints a trial keeps when it keeps every one it writes (see `checkpoints_to_keep`).
KEEP_ALL_UP_TO = 4


def checkpoints_to_keep(max_iterations: int, every: int, at_end: bool) -> int:
    """Tune's `num_to_keep` for a trial that trains `max_iterations` under the policy.

    Tune rewrites the whole sweep's state (every trial's, so its cost grows with the sweep) each
    time any trial has written `num_to_keep` checkpoints since the last rewrite, so that the state
    never names a checkpoint it has deleted. With `num_to_keep=KEEP_NEWEST` always, every trial
    of a short sweep forced one: 1.7 s of a 64-trial, 8-iteration sweep on a 2-core box
    (`benchmarks/sweep_overhead.py`). A trial that writes few checkpoints therefore keeps them all,
    and one more than it writes never forces a rewrite; a longer trial keeps `KEEP_NEWEST`, and
    the rewrites it forces are spread over its many iterations.
    """
    written = sum(checkpoint_due(i, max_iterations, every, at_end) for i in range(1, max_iterations + 1))
    return written + 1 if written + 1 <= KEEP_ALL_UP_TO else KEEP_NEWEST
