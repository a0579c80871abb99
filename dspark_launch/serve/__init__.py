"""Serving: the `vllm serve` command, its checks, launch, health and metrics."""
