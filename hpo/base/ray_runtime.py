"""Starting Ray for a sweep: an embedded local Ray that only this host can reach, or an existing cluster.

Two things Ray does not do for a local `ray.init()` are done here:

- Loopback only. Ray takes the node's address from the interface that routes outward and binds its
  gRPC servers (GCS, raylet, object manager, core workers) to every interface, and its agents to that
  address; a `ray.init(_node_ip_address="127.0.0.1")` is turned back into the outward address. Ray
  uses the loopback address as the node address, and binds every server to it, only when
  `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER` is false (its single-machine mode, meant for macOS and
  Windows, honoured on Linux too). Ray reads that variable once, when `ray` is first imported, so
  importing this module sets it (unless it is set already), and what starts a local Ray imports it
  before `ray`: the `hpo` command (`hpo/cli.py`) and `hpo`'s public names (`hpo/__init__.py`);
  where `ray` came earlier, `start_local_ray` has Ray read it again before starting. No engine imports it, so importing one
  (`fusion`, `pipeline_bubble`, `scheduler_bridge`) leaves the environment alone. Joining a cluster
  (`address=`) is unaffected.
- No process left behind. Ray ties the GCS, raylet and head processes to the driver (the kernel kills
  them when it dies), but not the dashboard agent and runtime-env agent that the raylet starts: after
  a SIGKILLed driver they wait a minute or more on the dead GCS. A small watchdog process (this
  file run as a script: `ray_runtime.py --reap DRIVER_PID RAY_PIDS...`) follows the local Ray's
  process tree while the driver lives and ends whatever of it the driver leaves behind, down to a
  worker the raylet started just before both died, found by the session name in its command line.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Ray's switch for its loopback-only single-machine mode (see the module docstring).
LOOPBACK_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
os.environ.setdefault(LOOPBACK_ONLY_ENV, "0")

#: The object store only carries checkpoints and small results; a small one starts fast.
LOCAL_OBJECT_STORE_BYTES = 256 * 1024**2
#: How often the watchdog re-reads the local Ray's process tree, which grows as workers start. Each
#: look reads the whole process table: every 0.5 s that kept a watchdog at 16% of a core on a
#: loaded 2-core box, beside the sweep it guards. What it must catch lives long (Ray's agents start
#: with the node), so a look every 2 s loses nothing, and a dead driver's Ray ends 2 s later at most.
WATCH_INTERVAL_S = 2.0
#: How long the processes of a dead driver's Ray get to exit on SIGTERM before SIGKILL.
TERM_GRACE_S = 2.0
#: How many times a local Ray is started before its failure to register is the sweep's error. Ray
#: gives a new raylet a fixed 30 s to register with the GCS, and the raylet its agents a fixed 15 s
#: to come up (ray-project/ray#65983, #62883; neither is configurable); on a loaded machine a start
#: runs out of one or the other now and then, and a second start, after the first one's processes
#: are ended, costs less than a failed sweep.
START_ATTEMPTS = 2
#: How Ray's `Node` words that failure, the only one that is worth a second start.
NODE_START_TIMEOUT = "timed out during startup"

logger = logging.getLogger(__name__)

#: Seconds a cluster's address gets to accept a connection before the command gives up on it.
CONNECT_TIMEOUT_S = 10.0


class BadClusterAddress(ValueError):
    """An address that is not HOST:PORT (nor `auto`, `local` or a `scheme://` address)."""


class UnreachableCluster(ConnectionError):
    """A HOST:PORT where nothing accepts a connection."""


class DashboardUnavailable(RuntimeError):
    """`dashboard=True` where Ray's dashboard cannot start: `ray` without its `[default]` extra."""


def check_dashboard_installed() -> None:
    """Ray's dashboard needs `ray[default]`; without it `ray.init(include_dashboard=True)` logs five
    lines and raises a bare `Exception` from deep in the node's start. Refused in one line first.
    `ray.dashboard.optional_deps` is the list Ray itself imports to decide whether its dashboard can
    start, so Ray stays the one judge of what the dashboard needs."""
    try:
        import ray.dashboard.optional_deps  # noqa: F401
    except ImportError as missing:
        raise DashboardUnavailable(f"--dashboard: Ray's dashboard is not installed ({missing}); "
                                   "install it with pip install 'ray[default]', or run without --dashboard") from None


def check_reachable(source: str, address: str) -> None:
    """A HOST:PORT where nothing accepts a connection is a one-line `UnreachableCluster` at once:
    `ray.init` would retry it for minutes, printing a warning every few seconds, and never give
    up. `auto`, `local` and addresses with a scheme (`ray://`) are left to Ray. `source` names
    where the address came from (`--address`, `RAY_ADDRESS`) for the message."""
    import socket

    if address in ("auto", "local") or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise BadClusterAddress(f"{source} {address!r}: expected HOST:PORT of the cluster's head (or auto)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise UnreachableCluster(f"{source} {address}: no Ray cluster answers there "
                                 f"({e.strerror or type(e).__name__})") from None


def use_token_auth_if_available() -> None:
    """Ray turns token authentication on by itself only for ``address="auto"``; with an
    explicit address (``--address``, ``RAY_ADDRESS``) a client holding the cluster's token
    (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``, Ray's documented
    sources) would connect without it and be refused. Never turns authentication off.
    Ray reads the mode when it is imported, so this runs before anything imports ray."""
    if os.environ.get("RAY_AUTH_MODE"):
        return
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or os.path.isfile(path):
        os.environ["RAY_AUTH_MODE"] = "token"


def cluster_address(address: str | None, default: str | None = None) -> str | None:
    """The cluster to join: `address` (`--address`), else `RAY_ADDRESS`, else `default`; checked
    first to accept a connection (`check_reachable`, whose refusal names where it came from)."""
    source = "--address" if address else "RAY_ADDRESS"
    address = address or os.environ.get("RAY_ADDRESS") or default
    if address:
        check_reachable(source, address)
    return address


def ensure_ray(
    address: str | None = None, dashboard: bool = False, num_gpus: int | None = None,
    code_folder: str | Path | None = None, exclude: Sequence[str | Path] = (),
) -> None:
    """Connect to `address` (or `RAY_ADDRESS`), else start a local Ray using every core here.

    `code_folder`, the user's code beside a sweep file, travels to every worker as the job's
    working directory, less the folders in `exclude` (`code_runtime_env`). What trials print
    reaches this terminal, prefixed by Ray with the trainable's name and pid, as under plain Ray
    Tune (and with the trial's id: `hpo.reporting.trial_output`, which also quiets Ray on the workers);
    Ray's own INFO lines here do not, except with `dashboard`, where Ray's start-up line gives the
    dashboard's address. A Ray that is already up (a test fixture, a notebook) is used as it is.
    """
    import ray

    from hpo.base.actor_names import NAMESPACE  # here: this file also runs alone as the watchdog

    if ray.is_initialized():
        return
    runtime_env = code_runtime_env(code_folder, exclude) if code_folder is not None else {}
    logging_level = logging.INFO if dashboard else logging.WARNING
    source = "--address" if address else "RAY_ADDRESS"
    address = cluster_address(address)
    if address:
        try:
            ray.init(address=address, namespace=NAMESPACE, runtime_env=_beside_submitted_job(runtime_env),
                     logging_level=logging_level)
        except ConnectionError as exc:
            raise _refusal(source, address, exc) from None
        return
    start_local_ray(
        num_cpus=os.cpu_count() or 1,
        num_gpus=num_gpus,
        dashboard=dashboard,
        object_store_memory=LOCAL_OBJECT_STORE_BYTES,
        runtime_env=runtime_env or None,
        logging_level=logging_level,
    )


def _refusal(source: str, address: str, error: ConnectionError) -> UnreachableCluster:
    """Ray's failure to join `address`, as one line: Ray's own is a traceback whose cause (a token
    the cluster refuses, most often) sits in the text of a chained exception."""
    reasons = []
    cause: BaseException | None = error
    while cause is not None:
        reasons.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    text = " ".join(reasons)
    if "InvalidAuthToken" in text or "AuthenticationError" in text:
        return UnreachableCluster(
            f"{source} {address}: the cluster refused this client's token (Authentication token is missing or "
            "incorrect); give it the cluster's token in RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token")
    last = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), type(error).__name__)
    return UnreachableCluster(f"{source} {address}: cannot join the Ray cluster there ({last})")


def code_runtime_env(folder: str | Path, exclude: Sequence[str | Path] = ()) -> dict[str, Any]:
    """A runtime env that makes `folder` every worker's working directory, so the modules beside a
    sweep file import on any worker (the one named and the ones it imports), wherever `hpo run`
    was started from and on whichever node a trial lands.

    Ray zips the folder (minus what `.gitignore` and `.rayignore` there exclude) into its object
    store once per run; `exclude` names folders under it that must not travel, such as the
    sweep's own storage, which grows with every run.
    """
    folder = Path(folder).resolve()
    excludes = []
    for path in exclude:
        path = Path(path).resolve()
        if path.is_relative_to(folder) and path != folder:
            excludes.append("/" + path.relative_to(folder).as_posix() + "/")  # anchored at `folder`
    return {"working_dir": str(folder), **({"excludes": excludes} if excludes else {})}


#: Where Ray's job supervisor puts a `ray job submit` job's runtime env for its entrypoint.
SUBMITTED_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def _beside_submitted_job(runtime_env: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Under `ray job submit`, Ray refuses a driver's runtime env that sets a field the job sets
    too. The job's own fields win: its `--working-dir` is then the code that travels, as the
    person who submitted it chose."""
    job = json.loads(os.environ.get(SUBMITTED_JOB_CONFIG_ENV) or "{}").get("runtime_env") or {}
    code = {"working_dir", "excludes"}
    taken = set(job) | (code if code & set(job) else set())
    return {key: value for key, value in (runtime_env or {}).items() if key not in taken} or None


def start_local_ray(num_cpus: int, num_gpus: int | None = None, dashboard: bool = False,
                    object_store_memory: int = LOCAL_OBJECT_STORE_BYTES, **init_kwargs: Any) -> None:
    """Start a new Ray on this machine that listens on loopback only and dies with this process.

    A new Ray even when `ray start` runs a cluster on this machine (`address="local"`). Token
    authentication stays as Ray sets it (on for a new local Ray); it is never turned off here.
    `init_kwargs` go to `ray.init` (a test's `runtime_env`, `_system_config`). Workers' output
    reaches this process (Ray's `log_to_driver`, on by default).
    """
    import psutil
    import ray

    from hpo.base.actor_names import NAMESPACE  # here: this file also runs alone as the watchdog

    _reread_loopback_switch()
    if dashboard:
        check_dashboard_installed()
    node_ip = ray.util.get_node_ip_address()  # before init: the address Ray will bind to
    if not ipaddress.ip_address(node_ip).is_loopback:
        logger.warning(
            "the local Ray will listen on %s and on all interfaces: %s is set in the environment; "
            "set it to 0 (or unset it) for a Ray only this host can reach", node_ip, LOOPBACK_ONLY_ENV)
    # Ray's notice that it turned token authentication on ends with how to turn it off; the README
    # says why it stays on, and nothing here turns it off.
    logging.getLogger(_AUTH_NOTICE_LOGGER).addFilter(_no_advice_to_disable_auth)
    me = psutil.Process()
    before = {child.pid for child in me.children()}
    try:
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                ray.init(
                    address="local",
                    num_cpus=num_cpus,
                    num_gpus=num_gpus,
                    include_dashboard=dashboard,
                    dashboard_host="127.0.0.1",  # Ray's default; stated, as it is the one server Ray lets us place
                    object_store_memory=object_store_memory,
                    namespace=NAMESPACE,
                    **init_kwargs,
                )
                break
            except Exception as error:
                if attempt == START_ATTEMPTS or NODE_START_TIMEOUT not in str(error):
                    raise
                logger.warning("the local Ray did not come up in time (%s); starting it again", error)
                _end([process for child in me.children() if child.pid not in before
                      for process in _with_descendants(child)])
    finally:
        # Started or not: a start that fails (Ray's node did not register within its 30 s) leaves
        # what it had started running, and that ends with this process too.
        _start_watchdog([child.pid for child in me.children() if child.pid not in before])
    keep_token_private()


def _reread_loopback_switch() -> None:
    """Have Ray read `LOOPBACK_ONLY_ENV` again, as it would had `ray` been imported now.

    A script that imports `ray` before this module (`import hpo` then `from ray import tune`, as the
    README's examples do: importing `hpo` sets nothing, see `hpo/__init__.py`) left Ray's copy of the
    switch saying 'every interface'. Ray's Python side reads only that copy, to choose the node
    address every server then binds to, and its processes inherit the environment this module
    set, so updating the copy before `ray.init` makes the local Ray loopback-only whatever the
    import order; a switch the user set to 1 is honoured as before."""
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = ray_constants.env_bool(LOOPBACK_ONLY_ENV, ray_constants.ENABLE_RAY_CLUSTER)


#: The logger of Ray's notice when it turns token authentication on for a new local Ray.
_AUTH_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"


#: How Ray's notice begins. It is given in full only to say how to opt out, which hpo never
#: advises. (Asking for token mode in the environment instead would skip the notice, but Ray reads
#: the mode once, when `ray` is first imported: a user who imported it before hpo would start a
#: Ray whose servers want a token the driver never generated.)
_AUTH_ON_NOTICE = "Token authentication is enabled for this Ray cluster"


def _no_advice_to_disable_auth(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(_AUTH_ON_NOTICE)


#: Where Ray keeps the token it generates for a local cluster (its documented default).
RAY_TOKEN_FILE = Path.home() / ".ray" / "auth_token"


def keep_token_private(token_file: Path = RAY_TOKEN_FILE) -> None:
    """Ray writes the generated cluster token world-readable (0644); anyone on the machine could
    then run code on the cluster. Only its owner may read it."""
    if token_file.exists():
        token_file.chmod(0o600)


def _start_watchdog(ray_roots: Sequence[int]) -> None:
    """Start the process that ends this Ray's processes once this one is gone, however it died.

    It runs this file as a script (stdlib and psutil only: it starts in a blink and needs no
    import path; `-P` keeps this package's folder off `sys.path`), in its own session so that a
    terminal's Ctrl-C, meant for the driver, which then shuts Ray down itself, does not reach it.
    """
    subprocess.Popen(
        [sys.executable, "-P", os.path.abspath(__file__), "--reap", str(os.getpid()), *map(str, ray_roots)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _reap_when_driver_exits(driver_pid: int, ray_roots: Sequence[int]) -> None:
    """Follow the driver's Ray processes and their descendants until the driver exits, then end them.

    Processes are remembered with their start time (psutil checks it before signalling), so a
    recycled pid is never signalled.
    """
    import psutil

    try:
        driver = psutil.Process(driver_pid)
    except psutil.NoSuchProcess:
        driver = None
    roots = []
    for pid in ray_roots:
        try:
            roots.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    session = _session_name(roots)
    watched: dict[int, psutil.Process] = {}

    def look() -> None:
        # One read of the process table per look: psutil's children(recursive=True) reads all of
        # it per call, and calling it for each of dozens of watched processes every half second
        # kept a watchdog at several percent of a core.
        by_parent: dict[int, list[psutil.Process]] = {}
        for process in psutil.process_iter():
            try:
                by_parent.setdefault(process.ppid(), []).append(process)
            except psutil.NoSuchProcess:
                pass

        def descendants(pid: int) -> list[psutil.Process]:
            found, stack = [], [pid]
            while stack:
                for child in by_parent.get(stack.pop(), []):
                    found.append(child)
                    stack.append(child.pid)
            return found

        for process in [*roots, *watched.values()]:
            for found in [process, *descendants(process.pid)]:
                watched.setdefault(found.pid, found)
        # Ray processes the driver starts after `ray.init` (runtime-env and log helpers) hang
        # from the driver, not from the processes `ray.init` started. Once this Ray is shut down
        # (its roots gone), the driver's Ray processes belong to its next Ray, and its own watchdog.
        if not any(_alive(root) for root in roots):
            return
        for found in descendants(driver.pid) if driver is not None else []:
            try:
                if found.pid not in watched and found.pid != os.getpid() and _is_ray_process(found):
                    watched.setdefault(found.pid, found)
            except psutil.NoSuchProcess:
                pass

    looked = False
    while _alive(driver):
        look()
        watched = {pid: process for pid, process in watched.items() if _alive(process)}
        if not looked:  # to whoever reads the watchdog's output (nobody, when Ray starts it)
            print(f"watching driver {driver_pid} and {len(watched)} Ray process(es) of session {session}", flush=True)
            looked = True
        if not watched:
            return  # the driver shut its Ray down and lives on: nothing left to watch
        time.sleep(WATCH_INTERVAL_S)
    look()  # once more: a worker the raylet started since the last look is not in `watched` yet
    # The raylet ends with its driver, often before that look: a worker it started since the last
    # look is then an orphan, no one's descendant, but its command line still names this Ray's session.
    for process in _processes_of_session(session) if session else []:
        watched.setdefault(process.pid, process)
    _end(list(watched.values()))


#: The name Ray gives one Ray instance (its folder under the temp dir), in its processes' command lines.
_SESSION_NAME = re.compile(r"session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_\d+")


def _session_name(processes: Sequence[Any]) -> str | None:
    """The Ray session these processes (the ones a Ray start left running) belong to."""
    import psutil

    for process in processes:
        try:
            found = _SESSION_NAME.search(" ".join(process.cmdline()))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if found:
            return found.group()
    return None


def _processes_of_session(session: str) -> list[Any]:
    """The Ray processes running whose command line names `session`."""
    import psutil

    found = []
    for process in psutil.process_iter():
        try:
            if session in " ".join(process.cmdline()) and _is_ray_process(process):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def _with_descendants(process: Any) -> list[Any]:
    import psutil

    try:
        return [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _end(processes: Sequence[Any]) -> None:
    """SIGTERM, then SIGKILL for what is still running after TERM_GRACE_S."""
    import psutil

    survivors = [process for process in processes if _alive(process)]
    for process in survivors:
        _signal(process, signal.SIGTERM)
    _, still_alive = psutil.wait_procs(survivors, timeout=TERM_GRACE_S)
    for process in still_alive:
        _signal(process, signal.SIGKILL)


def _is_ray_process(process: Any) -> bool:
    """A watchdog (this file run as a script) is not one: the watchdogs of a driver's successive
    Rays (a test process starts one per module) would follow each other and none would ever end."""
    import psutil

    try:
        cmdline = process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return os.path.abspath(__file__) not in cmdline and any("ray" in part for part in cmdline)


def _alive(process: Any) -> bool:
    """Running and not a zombie (a dead driver stays a zombie until its parent reaps it)."""
    import psutil

    try:
        return process is not None and process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _signal(process: Any, signum: int) -> None:
    import psutil

    try:
        process.send_signal(signum)  # psutil checks the start time: never a recycled pid
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass


def _main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="ray_runtime.py", description=__doc__)
    parser.add_argument("--reap", type=int, nargs="+", required=True, metavar="PID",
                        help="the driver's pid, then the pids of the Ray processes it started")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _reap_when_driver_exits(args.reap[0], args.reap[1:])


if __name__ == "__main__":
    _main()
