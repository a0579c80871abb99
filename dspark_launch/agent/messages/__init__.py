"""The agent protocol's messages, one module per handler subject (`protocol` re-exports them)."""
