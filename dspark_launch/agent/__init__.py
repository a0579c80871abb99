"""The node agent: its protocol, the launcher end (client, transports) and the node end (server, handlers).

Imports nothing of dspark_launch above it (errors, node and hotfix only): docs/architecture.md."""
