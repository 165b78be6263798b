"""The trace-driven simulator: replay a cluster trace under a policy and measure the result.

``simulator.simulate`` runs the replay each policy names (``rigid_replay``, ``elastic_replay``,
``lucid_replay``); the rigid replay runs the layers a policy names beside it (``layer``:
``power_states`` powers nodes for CES, ``tuning_guests`` places tuning work). ``traces`` reads
Philly, Helios and Pollux traces and ``synthetic`` makes small ones; ``metrics`` and ``plots`` turn
a run's ``run_log.RunLog`` into numbers (energy included) and figures; ``cli`` is ``hpo sim``. It
imports the policies and the shared model, never the live allocator.
"""
