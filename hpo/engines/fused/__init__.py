"""A sweep fused on its own devices: Tune runs groups of configurations, each trained as one fused model."""
