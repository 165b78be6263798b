"""Cluster side: job and cluster model, scheduling policies, trace simulator, Ray placement-group allocator."""
