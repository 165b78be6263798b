"""DeepSpeed's 1F1B training schedule as plain data: what every stage executes, in order, and who waits on whom.

The replayer (`pipeline_bubble.replay`) must predict configurations without DeepSpeed, torch or
Ray in the process, so it cannot ask `deepspeed.runtime.pipe.schedule.TrainSchedule` for the
instruction stream. `stage_instructions` generates the same stream the way `TrainSchedule.steps`
does (DeepSpeed 0.19: `pipeline_bubble.deepspeed_adapter.SUPPORTED`), step by step: a forward
step receives the activation and sends the previous micro-batch's gradient, a backward step
receives the gradient and sends the previous micro-batch's activation; the first and last
stages load micro-batches; the last step reduces and applies the gradients. The engine then
runs the loss broadcast (`LOSS_BROADCAST`), where the last stage sends the mean loss to all
others. `tests/test_pipeline_replay.py` checks the stream against the installed DeepSpeed.

Each instruction's position in its stage's stream is its *slot*, the number the instrumented
engine and the bubble executor know it by. Exchanges pair up by count, as `peer_signals` matches
them: the n-th `SendActivation` of stage s meets the n-th `RecvActivation` of stage s+1, and the
n-th `SendGrad` of stage s+1 the n-th `RecvGrad` of stage s.

>>> [i.name for i in stage_instructions(micro_batches=2, stages=2, stage=1)][:5]
['RecvActivation', 'LoadMicroBatch', 'ForwardPass', 'BackwardPass', 'SendGrad']
"""

from __future__ import annotations

from dataclasses import dataclass

#: The name the loss broadcast is recorded under: the engine runs it after the schedule, and it is
#: no DeepSpeed instruction.
LOSS_BROADCAST = "LossBroadcast"
#: Instructions that exchange tensors with a neighbour: name -> (neighbour's offset, its instruction).
EXCHANGES = {
    "SendActivation": (1, "RecvActivation"),
    "RecvActivation": (-1, "SendActivation"),
    "SendGrad": (-1, "RecvGrad"),
    "RecvGrad": (1, "SendGrad"),
}
#: Instructions that wait for other stages: the point-to-point exchanges and the loss broadcast.
BLOCKING = (*EXCHANGES, LOSS_BROADCAST)


@dataclass(frozen=True)
class Instruction:
    """One schedule instruction of one stage; `micro_batch` is -1 for those of the whole batch."""

    name: str
    micro_batch: int = -1
    buffer: int = -1

    @property
    def blocking(self) -> bool:
        return self.name in BLOCKING


def num_pipe_buffers(micro_batches: int, stages: int, stage: int) -> int:
    """`TrainSchedule.num_pipe_buffers`: the in-flight forward passes of the stage, at least 2."""
    return max(2, min(stages - stage, micro_batches))


def _step_micro_batch(step: int, stages: int, stage: int) -> tuple[int, bool]:
    """`TrainSchedule._step_to_micro_batch`: (micro-batch, is_forward) of `step` on `stage`."""
    if step % 2 == stage % 2:  # even stages go forward on even steps, odd stages on odd ones
        return (step - stage % 2) // 2 - stage // 2, True
    if stage % 2 == 1:  # odd stage, even step: backward
        return step // 2 - stages + (stage + 1) // 2, False
    return (step - 1) // 2 - stages + 1 + stage // 2, False


def stage_instructions(micro_batches: int, stages: int, stage: int) -> list[Instruction]:
    """Every instruction `stage` runs in one `train_batch`, in order, the loss broadcast last."""
    if stages < 2 or micro_batches < 1 or not 0 <= stage < stages:
        raise ValueError(f"needs stages >= 2, micro_batches >= 1 and 0 <= stage < stages; got {stages}, {micro_batches}, {stage}")
    buffers = num_pipe_buffers(micro_batches, stages, stage)
    first, last = stage == 0, stage == stages - 1
    out: list[Instruction] = []
    previous = -1
    total = 2 * (micro_batches + stages - 1)
    for step in range(total):
        micro_batch, forward = _step_micro_batch(step, stages, stage)
        valid, valid_previous = 0 <= micro_batch < micro_batches, 0 <= previous < micro_batches
        current = Instruction("", micro_batch, micro_batch % buffers) if valid else None
        before = Instruction("", previous, previous % buffers) if valid_previous else None
        if forward:
            if before and not first:
                out.append(Instruction("SendGrad", before.micro_batch, before.buffer))
            if current and not first:
                out.append(Instruction("RecvActivation", micro_batch, current.buffer))
        else:
            if current and not last:
                out.append(Instruction("RecvGrad", micro_batch, current.buffer))
            if before and not last:
                out.append(Instruction("SendActivation", before.micro_batch, before.buffer))
        if current and forward and (first or last):
            out.append(Instruction("LoadMicroBatch", micro_batch, current.buffer))
        if current:
            out.append(Instruction("ForwardPass" if forward else "BackwardPass", micro_batch, current.buffer))
        if step == total - 1:
            out += [Instruction("ReduceTiedGrads"), Instruction("ReduceGrads"), Instruction("OptimizerStep")]
        previous = micro_batch
    out.append(Instruction(LOSS_BROADCAST))
    return out


def exchange_partners(streams: list[list[Instruction]]) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """For every blocking (stage, slot): the (stage, slot)s it meets there.

    A point-to-point exchange meets one neighbour (matched by count); the last stage's loss
    broadcast meets every other stage's, and theirs meet the last stage's.
    """
    slots: dict[tuple[int, str], list[int]] = {}
    for stage, stream in enumerate(streams):
        for slot, instruction in enumerate(stream):
            if instruction.blocking:
                slots.setdefault((stage, instruction.name), []).append(slot)
    partners: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for (stage, name), own in slots.items():
        if name == LOSS_BROADCAST:  # the last stage sends to every other; each of those waits for it alone
            last = len(streams) - 1
            meets = [s for s in range(len(streams)) if s != stage] if stage == last else [last]
            partners[(stage, own[0])] = [(s, slots[(s, name)][0]) for s in meets]
            continue
        offset, other = EXCHANGES[name]
        theirs = slots.get((stage + offset, other), [])
        if len(theirs) != len(own):
            raise ValueError(f"stage {stage} has {len(own)} {name} but stage {stage + offset} has {len(theirs)} {other}")
        for mine, their in zip(own, theirs):
            partners[(stage, mine)] = [(stage + offset, their)]
    return partners
