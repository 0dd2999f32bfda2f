"""What the ports ask of the libraries they adapt; each imports only from base/:

  hvd_port       Horovod: its settings (CUDA's; the CPU's waits), how the gradients reach
                 it and their compression, Adasum's limits, the LR's scale, SyncBatchNorm swapped in
  process_group  torch.distributed: the DDP port's process group, joined and left whole, and
                 its summed metrics
  eager_sgd      torch's SGD, started without importing torch's compiler
"""
