"""Model profiles: what `vllm serve` needs for one model, resolved against the installed vLLM.

Kept import-free: config imports the profile names from `profiles.catalog`.
"""
