"""Helpers around the runs: results tables (compare.py), RESULT lines from pretrain_gpt logs
(parse_train_log.py, fp8_convergence.py), host syncs by call site (sync_debug_run.py), the
fp8-convergence corpus (make_code_corpus.py).
"""
