"""Parameter-free layers that read their input's layout, run stacked with members folded into the batch.

Element-wise layers (ReLU, Dropout) are indifferent to a leading member dimension, but a layer
that reads dimension 1 as channels (Dropout2d drops whole channels, MaxPool2d pools the last two
of a 4-D input, Flatten starts at dimension 1) would see `[B, N, C, ...]` and act on the wrong
dimensions: Dropout2d on the stacked path dropped whole samples instead of channels. `FoldedLeaf`
runs the member's own layer on `[B*N, C, ...]`, exactly the layout it expects, and unfolds the
result, so such a layer computes what it computes unfused, with its own kernel, for all members
in one call. A layer that reduces over the batch (softmax over dim 0) mixes members when folded;
the independence check refuses it on this path and `auto` falls back to vmap.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class FoldedLeaf(nn.Module):
    """Member 0's parameter-free layer applied to `[B*N, ...]` and unfolded to `[B, N, ...]`."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        # Not registered as a child: the fused tree keeps the member's own module paths.
        object.__setattr__(self, "inner", inner)

    @classmethod
    def from_members(cls, modules: Sequence[nn.Module]) -> "FoldedLeaf":
        return cls(modules[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        members, samples = x.shape[:2]
        self.inner.train(self.training)  # dropout layers read their mode
        out = self.inner(x.flatten(0, 1))
        if isinstance(out, tuple):  # pooling with return_indices=True
            return tuple(self._unfold(t, x, members, samples) for t in out)
        return self._unfold(out, x, members, samples)

    def _unfold(self, out: torch.Tensor, x: torch.Tensor, members: int, samples: int) -> torch.Tensor:
        if out.dim() == 0 or out.shape[0] != members * samples:
            raise ValueError(
                f"{type(self.inner).__name__} does not keep the batch dimension ({tuple(x.shape[1:])} -> "
                f"{tuple(out.shape)}), so it cannot run with members folded into the batch"
            )
        return out.unflatten(0, (members, samples))

    def extra_repr(self) -> str:
        return repr(self.inner)


#: Parameter-free layers whose behaviour depends on which dimension is the batch or channel one.
FOLDED_TYPES: tuple[type, ...] = (
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.FeatureAlphaDropout,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d,
    nn.LPPool1d,
    nn.LPPool2d,
    nn.Flatten,
    nn.Unflatten,
    nn.Upsample,
    nn.PixelShuffle,
    nn.PixelUnshuffle,
    nn.ChannelShuffle,
    nn.Softmax,
    nn.LogSoftmax,
    nn.Softmin,
    nn.GLU,
    nn.LocalResponseNorm,
    nn.ReflectionPad1d,
    nn.ReflectionPad2d,
    nn.ReflectionPad3d,
    nn.ReplicationPad1d,
    nn.ReplicationPad2d,
    nn.ReplicationPad3d,
    nn.CircularPad1d,
    nn.CircularPad2d,
    nn.CircularPad3d,
)

FOLDED_FUSERS = {kind: FoldedLeaf.from_members for kind in FOLDED_TYPES}
