"""Model profiles as data: what `vllm serve` needs for one model (`catalog`, `model`), GPU targets, the memory model.

Import-free (below config, which checks DSPARK_PROFILE against `catalog`); a profile is resolved against the
settings and the installed vLLM's offer in `config/profile_resolve.py`.
"""
