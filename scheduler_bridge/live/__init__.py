"""The live allocator: the policies run against a real Ray cluster.

``allocator.Allocator`` is the detached actor ``hpo:allocator``: it journals every change of its
job table (``journal``) before acting on it, decides with ``driver.LiveDriver`` (the policies
without Ray), and realises each decision as placement groups (``placement_groups``) running the
job's ``job_runner.JobRunner`` actors. ``packing``, ``profiling`` and ``autoscaling`` are what
Lucid and CES need only on a live cluster; ``client`` is the Python API users call, ``cli`` the
``hpo job`` command, and ``colocate`` (``hpo profile colocate``) measures the interference table
Lucid packs by. It imports the policies and the shared model, never the simulator.
"""
