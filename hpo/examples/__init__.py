"""The built-in example trainables, `trainable: mlp_digits`, `char_gpt` and `vit_digits` in a sweep file.

They ship inside `hpo` (as Ray Tune ships `ray.tune.examples`) so the built-in names resolve
wherever the package is installed; each is also the reference for writing a `Workload`.
"""
