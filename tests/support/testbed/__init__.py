"""The namespace testbed: N "DGX Spark" nodes on one machine (see README.md and testbed.py)."""
