"""The sweep engines: how each mode runs a sweep in Tune, behind one interface (`_base.SweepEngine`).

- `plain`: a Tune trial per configuration (a `Workload` trains as `workload_trial` says);
- `fused`: groups of configurations trained as one fused model are Tune's trials
  (engine, group searcher and scheduler, members, group trial, per-member callbacks);
- `bubbles`: fused groups trained in pipeline jobs' bubbles, one relay Tune trial per configuration;
- `scaled`: a muP proxy sweep around any of them, and the transfer to the target.

`choice.engine_for` decides the mode, once. Nothing is imported here: a bubble sweep's relay trial
(`bubbles.relay_trial`) runs in a worker that must not import torch.
"""
