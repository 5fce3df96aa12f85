"""Sharded attention on torch.distributed: each rank holds one contiguous slice along N (of a
sequence, or of the nodes of a graph batch) and gets its own output rows, equal to one process's
on the whole input to round-off, forward and backward (docs/design.md, "Sharded attention").

The process group is torch.distributed's (gloo on CPU, NCCL on GPUs; launched by torchrun or
torch.multiprocessing), WORLD unless ``group=`` names another: nothing here starts processes.
"""
from fast.distributed.collectives import CommunicationLog, CommunicationRecord, count_communication
from fast.distributed.nodes import (sharded_difformer_attention, sharded_kernelized_gumbel_softmax,
                                    sharded_kernelized_softmax, sharded_sgformer_attention)
from fast.distributed.sequence import shard_bounds, sharded_favor_attention, sharded_linear_attention

__all__ = ["CommunicationLog", "CommunicationRecord", "count_communication", "shard_bounds",
           "sharded_linear_attention", "sharded_favor_attention", "sharded_kernelized_softmax",
           "sharded_kernelized_gumbel_softmax", "sharded_sgformer_attention", "sharded_difformer_attention"]
