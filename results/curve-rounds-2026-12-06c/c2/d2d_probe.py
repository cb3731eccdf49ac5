"""Where the Python layer's D2D time goes at 1-16 MiB: cudabuf and CuPy calls on each
other's buffers, each library's synchronize, and the issue cost of one copy."""
import json, os, statistics, sys, time
import numpy as np
import cupy
import cudabuf
from cudabuf import cuda

cudabuf.set_backend("cuda")
ctx = cuda.Context(0)
stream = ctx.default_stream()
rt = cupy.cuda.runtime
out = {}

def timed(fn, sync, budget=0.05, least=50):
    fn(); sync()
    s = []; t0 = time.perf_counter()
    while len(s) < least or time.perf_counter() - t0 < budget:
        a = time.perf_counter(); fn(); sync(); s.append(time.perf_counter() - a)
        if len(s) >= 20000: break
    return statistics.median(s)

def issue_cost(fn, sync, n=200):
    best = None
    for _ in range(5):
        sync(); a = time.perf_counter()
        for _ in range(n): fn()
        b = time.perf_counter(); sync()
        v = (b - a) / n
        best = v if best is None else min(best, v)
    return best

for size in (4096, 1 << 20, 4 << 20, 16 << 20):
    csrc, cdst = cupy.ones(size, dtype=cupy.uint8), cupy.empty(size, dtype=cupy.uint8)
    bsrc, bdst = ctx.new_buffer(size), ctx.new_buffer(size)
    fsrc = ctx.foreign_buffer(csrc.data.ptr, size, base=csrc)
    fdst = ctx.foreign_buffer(cdst.data.ptr, size, base=cdst)
    csync, bsync = rt.deviceSynchronize, ctx.synchronize
    D2D = 3
    cases = {
        "cudabuf copy_device, cudabuf bufs, ctx.synchronize": (lambda: stream.copy_device(bdst, bsrc), bsync),
        "cupy copy_from_device, cupy bufs, deviceSynchronize": (lambda: cdst.data.copy_from_device(csrc.data, size), csync),
        "cupy memcpyAsync, cudabuf bufs, deviceSynchronize": (lambda: rt.memcpyAsync(bdst.address, bsrc.address, size, D2D, 0), csync),
        "cudabuf copy_device, cupy bufs (foreign), ctx.synchronize": (lambda: stream.copy_device(fdst, fsrc), bsync),
        "cudabuf copy_device, cudabuf bufs, deviceSynchronize": (lambda: stream.copy_device(bdst, bsrc), csync),
        "cupy memcpyAsync, cupy bufs, ctx.synchronize": (lambda: rt.memcpyAsync(cdst.data.ptr, csrc.data.ptr, size, D2D, 0), bsync),
        "cudabuf copy_from_device (sync), cudabuf bufs": (lambda: bdst.copy_from_device(bsrc), bsync),
    }
    res = {k: [] for k in cases}
    for _ in range(5):
        for k, (fn, sync) in cases.items():
            res[k].append(timed(fn, sync))
    row = {k: round(statistics.median(v) * 1e6, 3) for k, v in res.items()}
    if size == 4096:
        row["issue only: cudabuf copy_device"] = round(issue_cost(lambda: stream.copy_device(bdst, bsrc), bsync) * 1e6, 3)
        row["issue only: cupy memcpyAsync"] = round(issue_cost(lambda: rt.memcpyAsync(cdst.data.ptr, csrc.data.ptr, size, D2D, 0), csync) * 1e6, 3)
        row["idle ctx.synchronize"] = round(timed(lambda: None, bsync) * 1e6, 3)
        row["idle deviceSynchronize"] = round(timed(lambda: None, csync) * 1e6, 3)
        row["bdst.address calls"] = round(timed(lambda: bdst.address, lambda: None) * 1e6, 3)
    row["addresses mod 4096"] = [bsrc.address % 4096, bdst.address % 4096, csrc.data.ptr % 4096, cdst.data.ptr % 4096]
    out[size] = row
    print(size, json.dumps(row, indent=1), flush=True)
json.dump(out, open(os.path.join(sys.argv[1], "d2d_probe.json"), "w"), indent=1)
