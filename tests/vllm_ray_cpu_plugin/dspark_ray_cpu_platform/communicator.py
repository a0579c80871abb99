"""CPU communicator that uses shared memory only between ranks on the same host (TEST-ONLY).

vLLM's CPU communicator all-reduces through /dev/shm whenever every rank agrees on
a group name, which it derives from the rendezvous port alone. Across two hosts
(our namespace nodes each have their own /dev/shm, like two Sparks) the second
host cannot open the first one's segment and the engine dies with
"open shm in SHMManager failed". Requiring one hostname for the whole group makes
a multi-host group fall back to torch.distributed (Gloo over the fabric), which is
the CPU stand-in for what NCCL does on GB10s.
"""

from __future__ import annotations

import socket

import torch.distributed
from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator


class HostLocalCpuCommunicator(CpuCommunicator):
    def _all_group_ranks_share_shm_group_name(self) -> bool:
        hosts: list[str] = [""] * self.world_size
        torch.distributed.all_gather_object(hosts, socket.gethostname(), group=self.device_group)
        return len(set(hosts)) == 1 and super()._all_group_ranks_share_shm_group_name()
