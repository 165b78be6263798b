"""The trace-driven simulator: replay a cluster trace under a policy and measure the result.

``simulator.simulate`` picks the replay for the policy's kind (``rigid_replay``, ``elastic_replay``,
``lucid_replay``; ``power_states`` powers nodes under CES); ``traces`` reads Philly, Helios and
Pollux traces and ``synthetic`` makes small ones; ``metrics`` and ``plots`` turn a run's
``run_log.RunLog`` into numbers and figures. It imports the policies and the shared model, never
the live allocator.
"""
