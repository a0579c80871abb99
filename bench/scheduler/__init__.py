"""The scheduler benchmark: admission policies on identical workloads through the real vLLM
scheduler (`python -m bench.scheduler`). Not installed with dspark-launch.

It drives vLLM with tools/scheduler_harness.py, the driver the hotfix's tests use, so
the benchmark and the tests measure the same scheduler the same way.
"""
