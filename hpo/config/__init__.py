"""What a sweep asks for, checked before anything runs: the YAML schema (`spec`), the sweep file's
reader (`sweep_file`), the `logging:` block (`logging_spec`), where the user's trainable lives
(`trainable_lookup`), the checks made before Ray starts (`preflight`) and the one error type bad
input raises (`errors`).

No module here imports Ray or torch unless the user's trainable does: `hpo validate` stays fast.
"""
