"""What a sweep tells its user, live and at the end: the result object and its files
(`sweep_result`, `results_files`, `live_results`, `rebuild`), the progress line (`progress`),
the final report (`console`), each trial's output and errors (`trial_output`, `trial_errors`,
`tune_errors`), Tune's logger callbacks (`logging_callbacks`), the dashboard actor
(`dashboard_actor`) and the one reader of Tune's saved run state (`tune_state`).
"""
