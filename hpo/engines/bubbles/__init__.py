"""A sweep fused into pipeline jobs' bubbles: one light relay Tune trial per configuration."""
