"""The name the live allocator is found by, in the project's one Ray namespace.

The allocator, its clients (``live.client``) and the jobs it runs (``live.job_runner``: a rank
reports progress and reclaims its bubbles by name, so the lookup finds a restarted allocator too)
all need it; it lives below them so that each imports it one way.
"""

from __future__ import annotations

from hpo.ray_runtime import NAMESPACE

ALLOCATOR_NAME = "hpo:allocator"

__all__ = ["ALLOCATOR_NAME", "NAMESPACE"]
