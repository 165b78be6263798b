"""A multi-node Ray on this machine for the tests that need several nodes (`ray.cluster_utils.Cluster`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from patience import patience


def ensure_ray_token() -> None:
    """Give this user a cluster token if none is set (`ray get-auth-token --generate`).

    `ray.init` writes ~/.ray/auth_token when it starts a local Ray, but a `Cluster`'s head is
    started without it: on a fresh machine (CI's), with token authentication on and no token
    yet, its GCS exits at once ("Ray couldn't find an authentication token") and the start
    times out 30 s later."""
    from hpo.base.ray_runtime import keep_token_private

    ray_cli = Path(sys.executable).with_name("ray")
    subprocess.run([str(ray_cli), "get-auth-token", "--generate"], check=True, capture_output=True,
                   timeout=patience(120))
    keep_token_private()
