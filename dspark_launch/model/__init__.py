"""Model weights on every node: pull from the hub, copy over the fabric, verify through each node's agent.

Launcher-side: `hub` (huggingface_hub), `location`, `copy` (rsync over SSH), `distribute`, `onnodes`.
The node side (manifest, file checks, folder checks) is the agent's: `node/manifest.py`,
`node/model_files.py`, `node/model_folder.py`.
"""
