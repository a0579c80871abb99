"""Model weights on every node: manifest, pull from the hub, copy over the fabric, verify.

Node-side (stdlib only, run by the agent on each node): `manifest`, `node_check`.
Launcher-side: `hub` (huggingface_hub), `location`, `copy` (rsync over SSH), `distribute`.
"""
