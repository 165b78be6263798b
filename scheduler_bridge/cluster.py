"""Cluster model: nodes of GPUs, free-GPU book-keeping and the placement rule.

Placement rule (the same for every policy and both drivers): a job of at most
``gpus_per_node`` GPUs goes on one node, best fit (the node with the fewest free
GPUs that still fits it, lowest index on ties); a larger job takes whole free
nodes and, for any remainder, one more node by best fit. With
``consolidate=False`` a large job may instead take free GPUs from any nodes.

>>> free = FreeGPUs(ClusterSpec(num_gpus=16, gpus_per_node=8))
>>> p = free.place(4); p
((0, 4),)
>>> free.take(p); free.total_free
12
"""

from __future__ import annotations

from dataclasses import dataclass

Placement = tuple[tuple[int, int], ...]  # ((node, gpus), ...)


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """``num_gpus`` GPUs in nodes of ``gpus_per_node``; when ``num_gpus`` is not a
    multiple, the last node is smaller."""

    num_gpus: int
    gpus_per_node: int = 8
    gpu_type: str = "gpu"
    consolidate: bool = True

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise ValueError(f"num_gpus must be >= 1, got {self.num_gpus}")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be >= 1, got {self.gpus_per_node}")

    @property
    def node_capacities(self) -> tuple[int, ...]:
        full, rest = divmod(self.num_gpus, self.gpus_per_node)
        return (self.gpus_per_node,) * full + ((rest,) if rest else ())

    @property
    def num_nodes(self) -> int:
        return len(self.node_capacities)

    def fits_ever(self, gpus: int) -> bool:
        """Whether an empty cluster can place a job of ``gpus`` GPUs."""
        return FreeGPUs(self).place(gpus) is not None


class FreeGPUs:
    """Free GPUs per node, with nodes bucketed by free count so that a
    best-fit placement costs O(gpus_per_node), not O(nodes)."""

    __slots__ = ("spec", "cap", "free", "_buckets", "total_free")

    def __init__(self, spec: ClusterSpec):
        self.spec = spec
        self.cap = list(spec.node_capacities)
        self.free = list(self.cap)
        g = spec.gpus_per_node
        self._buckets: list[set[int]] = [set() for _ in range(g + 1)]
        for n, c in enumerate(self.cap):
            self._buckets[c].add(n)
        self.total_free = spec.num_gpus

    def copy(self) -> "FreeGPUs":
        other = FreeGPUs.__new__(FreeGPUs)
        other.spec, other.cap, other.free = self.spec, self.cap, list(self.free)
        other._buckets = [set(b) for b in self._buckets]
        other.total_free = self.total_free
        return other

    def _whole_free_nodes(self) -> list[int]:
        g = self.spec.gpus_per_node
        return sorted(n for n in self._buckets[g] if self.cap[n] == g)

    def _best_fit(self, gpus: int, exclude=()) -> int | None:
        for k in range(gpus, self.spec.gpus_per_node + 1):
            b = self._buckets[k]
            if b:
                cands = b.difference(exclude) if exclude else b
                if cands:
                    return min(cands)
        return None

    def place(self, gpus: int) -> Placement | None:
        """Where a job of ``gpus`` GPUs would go now, or None. Does not take them."""
        if gpus <= 0:
            raise ValueError(f"a job needs >= 1 GPU, got {gpus}")
        if gpus > self.total_free:
            return None
        g = self.spec.gpus_per_node
        if gpus <= g:
            n = self._best_fit(gpus)
            return None if n is None else ((n, gpus),)
        if not self.spec.consolidate:
            out, need = [], gpus
            for n in sorted(range(len(self.free)), key=lambda n: (-self.free[n], n)):
                if need == 0:
                    break
                take = min(need, self.free[n])
                if take:
                    out.append((n, take))
                    need -= take
            return tuple(out) if need == 0 else None
        whole, rest = divmod(gpus, g)
        nodes = self._whole_free_nodes()
        if len(nodes) < whole:
            return None
        out = [(n, g) for n in nodes[:whole]]
        if rest:
            n = self._best_fit(rest, exclude=set(nodes[:whole]))
            if n is None:
                return None
            out.append((n, rest))
        return tuple(out)

    def _set(self, node: int, value: int) -> None:
        self._buckets[self.free[node]].discard(node)
        self.free[node] = value
        self._buckets[value].add(node)

    def take(self, placement: Placement) -> None:
        for node, k in placement:
            if k > self.free[node]:
                raise RuntimeError(f"node {node} has {self.free[node]} free GPUs, asked for {k}")
            self._set(node, self.free[node] - k)
            self.total_free -= k

    def give(self, placement: Placement) -> None:
        for node, k in placement:
            if self.free[node] + k > self.cap[node]:
                raise RuntimeError(f"node {node} would have more free GPUs than it has")
            self._set(node, self.free[node] + k)
            self.total_free += k
