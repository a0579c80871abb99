"""What the tests share. Test modules import from here and from the product only, never from
each other; tests/conftest.py registers the fixtures of fixtures.py and the step hook.

paths         where things are in the checkout (REPO, DATA, REGISTRY_SH)
processes     start, identify (pid + start time, the product's procfs) and stop processes
launcher_env  env files, the launcher's environment, scratch folders, `dspark` run here
on_testbed    `dspark` run in the testbed's head node, its record, what it leaves running
testbed/      the namespace testbed (base, namespaces, requirements, nodes, sshd, fabric,
              overlays, testbed, CLI, pytest fixture)
serving       Ray head + vLLM API server on loopback without the launcher, HTTP, log tails
tiny_model    the tiny random Llama served by the tests and the demo (demo/)
sysfs         a DGX Spark's sysfs tree (netdevs, RDMA devices, GIDs) under a folder
fixtures      the shared pytest fixtures
containers    podman on the testbed and the registry-free test image
hub_server    a loopback Hugging Face hub; model_nodes / model_runner: model checks on nodes
(vLLM's scheduler driven without a model, shared with bench/: tools/scheduler_harness.py)
sched_configs the toy and the recipe's scheduler configurations the hotfix's behavioural tests run in
steps         `step("name")` in a long scenario test: a failure names the step it happened in
"""
