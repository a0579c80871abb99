"""Development code beside the product, never in the wheel (run from a checkout).

generate          the files written from the setting declarations (`python -m tools.generate [--check]`)
settings_docs     the settings reference block that docs/configuration.md embeds (`python -m tools.settings_docs`)
hotfix_bundle     the standalone patch script in patches/ (`python -m tools.hotfix_bundle [--check]`)
scheduler_harness vLLM's own scheduler driven step by step without a model: the hotfix's tests and bench/
readme_sample     the README's sample start output, from a real `make demo` run (`python -m tools.readme_sample`)
qualify_vllm      one vLLM release qualified in one command: hotfix, randomized check, dry boot, memory rules
                  (`python -m tools.qualify_vllm X.Y.Z [--json FILE]`)
"""
