"""Scheduling policies: pure decisions, shared by the simulator and the live allocator.

A policy is a plain object that ranks, places, resizes or packs jobs given the job table and the
free GPUs; it never advances time and never touches Ray. ``scheduler_bridge.simulation`` replays
traces through these objects and ``scheduler_bridge.live`` drives them from a real job table, so
neither is imported here. ``_base`` is the interface every policy implements, and
``registry.make_policy`` builds one by name.
"""
