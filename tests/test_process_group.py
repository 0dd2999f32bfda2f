"""process_group.py in process: a lone main_ddp.py's group of one, left whole, and the keyword
that leaves BatchNorm's buffers to each rank under this PyTorch. Its runs under torchrun (ranks
left whole at every way a run ends) are in test_main_ddp.py."""
import inspect

import torch
import torch.distributed as dist

from training.ports import process_group


def test_a_lone_process_joins_a_group_of_one_and_leaves_it_whole(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    process_group.join_job(torch.device("cpu"))
    try:
        assert dist.is_initialized() and dist.get_world_size() == 1 and dist.get_backend() == "gloo"
        t = torch.ones(3)
        dist.all_reduce(t)
        assert torch.equal(t, torch.ones(3))
    finally:
        process_group.leave_job()
    assert not dist.is_initialized()
    process_group.leave_job()  # a second leave, as after a failed join, does nothing


def test_the_buffers_keyword_is_one_this_ddp_accepts_and_it_keeps_buffers_local(monkeypatch):
    """forward_sync_buffers where DDP has it (2.14), broadcast_buffers before it (2.11 has no
    other): either way DDP must take it, and must not broadcast buffers before a forward."""
    keyword = process_group.buffers_unsynced()
    ddp_params = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    assert list(keyword) == ["forward_sync_buffers" if "forward_sync_buffers" in ddp_params
                             else "broadcast_buffers"] and list(keyword.values()) == [False]
    monkeypatch.delenv("RANK", raising=False)
    process_group.join_job(torch.device("cpu"))
    try:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
        ddp = torch.nn.parallel.DistributedDataParallel(model, **keyword)
        assert not ddp.will_sync_module_buffers()
    finally:
        process_group.leave_job()
