"""Per-copy times of cudabuf's pageable copies in the Python bench's loop (a copy, then
Context.synchronize), at 1, 4 and 16 MiB both ways; with --peers, PyTorch and CuPy are
imported and used first (as in the bench, where they run in the same process).
Usage: pydiag.py OUT.json [--peers]"""
import json, os, statistics, sys, time
import numpy as np

out = sys.argv[1]
peers = "--peers" in sys.argv
if peers:
    import torch, cupy
    for s in (1 << 20, 4 << 20, 16 << 20):
        t = torch.ones(s, dtype=torch.uint8); d = torch.empty(s, dtype=torch.uint8, device="cuda")
        for _ in range(20): d.copy_(t); torch.cuda.synchronize()
        c = cupy.empty(s, dtype=cupy.uint8); a = np.ones(s, dtype=np.uint8)
        for _ in range(20): c.data.copy_from_host(a.ctypes.data, s); cupy.cuda.runtime.deviceSynchronize()
import cudabuf
from cudabuf import cuda
cudabuf.set_backend("cuda")
ctx = cuda.Context(0)
res = {"env": {k: v for k, v in os.environ.items() if k.startswith("CUDABUF")}, "peers": peers, "runs": []}
for size in (1 << 20, 4 << 20, 16 << 20):
    pageable = np.ones(size, dtype=np.uint8)
    buf = ctx.new_buffer(size)
    for op in ("h2d", "d2h"):
        fn = (lambda: buf.copy_from_host(pageable)) if op == "h2d" else (lambda: buf.copy_to_host(buf=pageable))
        fn(); ctx.synchronize()
        ts = []
        began = time.perf_counter()
        while len(ts) < 300 and time.perf_counter() - began < 3.0:
            s = time.perf_counter(); fn(); ctx.synchronize(); ts.append(time.perf_counter() - s)
        us = [t * 1e6 for t in ts]
        q = statistics.quantiles(us, n=4)
        r = {"size": size, "op": op, "n": len(us), "median_us": statistics.median(us), "min_us": min(us),
             "p25_us": q[0], "p75_us": q[2], "gbps_median": size / statistics.median(us) / 1e3,
             "series_us": [round(x, 1) for x in us]}
        res["runs"].append(r)
        print(f"{size>>20:3d}M {op} n={len(us)} median {r['median_us']:8.1f} us ({r['gbps_median']:5.1f} GB/s) min {r['min_us']:8.1f} p25 {q[0]:8.1f} p75 {q[2]:8.1f}; first 40: {' '.join(str(int(x)) for x in us[:40])}", flush=True)
json.dump(res, open(out, "w"))
