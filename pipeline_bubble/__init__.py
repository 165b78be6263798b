"""Harvesting the idle bubbles of DeepSpeed pipeline-parallel jobs for fused tuning work."""
