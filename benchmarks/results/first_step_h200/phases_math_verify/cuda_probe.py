"""CUDA's start-up against the CLI's imports: in sequence, or in a thread beside them; and whether the
thread leaves the GIL to the main thread while CUDA starts."""
import sys, threading, time
t0 = time.time()
mode = sys.argv[1]
import torch
from grpo_lightning.import_pause import collection_paused
t_torch = time.time() - t0

def init_cuda(blas=False):
    torch.cuda.init()
    torch.empty(1, device="cuda")
    if blas:
        a = torch.ones(64, 64, device="cuda"); (a @ a).sum().item()
    torch.cuda.synchronize()

def timed(fn):
    s = time.time(); fn(); return time.time() - s

def imports():
    with collection_paused():
        import grpo_lightning.cli.app  # noqa

out = {}
if mode in ("seq", "seqblas"):
    out["cuda"] = timed(lambda: init_cuda(mode == "seqblas"))
    out["import"] = timed(imports)
elif mode in ("thread", "threadblas"):
    done = {}
    def job():
        s = time.time(); init_cuda(mode == "threadblas"); done["cuda"] = time.time() - s
    th = threading.Thread(target=job); s = time.time(); th.start()
    imports(); out["import"] = time.time() - s
    th.join(); out["both"] = time.time() - s; out["cuda"] = done["cuda"]
elif mode == "importonly":
    out["import"] = timed(imports)
elif mode == "gil":
    # Python iterations the main thread makes per second alone, then while a thread starts CUDA
    def spin(seconds):
        n = 0; end = time.time() + seconds
        while time.time() < end: n += 1
        return n / seconds
    alone = spin(0.5)
    th = threading.Thread(target=init_cuda); s = time.time(); th.start()
    n = 0
    while th.is_alive(): n += 1
    spent = time.time() - s
    out["cuda"] = spent; out["rate_alone"] = alone; out["rate_beside"] = n / spent
out["torch_import"] = t_torch
out["total"] = time.time() - t0
print(mode, {k: round(v, 3) if v < 1000 else int(v) for k, v in out.items()}, flush=True)
