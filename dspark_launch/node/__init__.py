"""What runs on a node, stdlib only: the libraries the agent's handlers run (`procfs`, `safe_path`, `ray_dirs`,
`fabric`, `nccl_hca`, `versions`, `vllm_offer`, `vllm_dryboot`, `engine_log`, the model files' `manifest`,
`model_files`, `model_folder`, `model_paths`) and the values they return (`values`), the worker host's half of
shipping the package (`agent_copy_host`) and the head's vLLM entry (`serve_entry`).

Imports nothing of dspark_launch but `errors`: docs/architecture.md. The launcher imports these libraries too."""
