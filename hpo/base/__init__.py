"""The base every engine shares: the workload contract (`workload`), hyperparameters (`hparams`),
one trial state (`trial_state`, `checkpointing`), one unfused training loop (`training`), the
embedded Ray's settings (`ray_runtime`), the actors' names (`actor_names`), what machine this
is (`machine`, read without torch: measurements carry it) and the figures drawn into files
(`figures`, without pyplot).

Nothing here imports Ray Tune or an engine (`fusion`, `pipeline_bubble`, `scheduler_bridge`):
the engines build on these modules and the Tune/CLI layer of `hpo` composes the engines, so
imports run one way (`tests/test_import_layers.py`). Import the modules themselves; this package
re-exports nothing, so importing one module costs only that module.
"""
