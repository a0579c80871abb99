"""dspark-launch: serve DeepSeek-V4-Flash with vLLM over Ray across DGX Spark nodes."""

__version__ = "0.1.0"
