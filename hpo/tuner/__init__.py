"""`hpo.Tuner` and `hpo.run`: Ray Tune's objects built from a sweep (`sweep`), the `Tuner` that
composes the sweep's engine (`tuner`), where runs live on disk (`run_folders`) and how Tune's
storage is written (`atomic_storage`).
"""
