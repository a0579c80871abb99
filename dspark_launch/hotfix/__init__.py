"""The scheduler hotfix for the installed vLLM: it caps concurrent partial prefills and bounds each step's prefill.

`contract` holds the facts every side agrees on; `injected` the code that goes
into vLLM's scheduler.py; `layout` where it goes; `patch_tool` the tool
(status/check/apply/revert); `tools/hotfix_bundle.py` builds the standalone script in patches/.
"""
