import torch
from planner.runtime.trace import trace_rank, HOST
from planner.runtime import shim
def build():
    x = torch.empty(1024, 1024, requires_grad=True)
    w = torch.empty(1024, 1024, requires_grad=True)
    def step():
        y = (x @ w).relu()
        y.sum().backward()
        out = torch.empty(4*1024, 1024)
        shim.all_gather(out, x.detach())
        a = torch.empty(10, 8); shim.all_to_all_single(a, torch.empty(17, 8), [1,2,3,4], [5,5,5,2])
        buf = y.detach().to(HOST)
    return [x, w], step
print("trace on", torch.__version__, trace_rank(build, rank=1, world_size=4))
