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
