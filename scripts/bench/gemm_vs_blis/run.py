#!/usr/bin/env python3
"""Runs the bench in separate processes (gemm/BLIS/engine × 1/2 threads), several rounds, each
process started when the machine is quiet; records the other processes' CPU use during it."""
import json, os, resource, subprocess, sys, time

# usage: run.py BIN ROUNDS OUT.jsonl
BIN = sys.argv[1]
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
OUT = sys.argv[3]
HZ = os.sysconf("SC_CLK_TCK")

def busy():
    f = open("/proc/stat").readline().split()[1:]
    v = list(map(int, f))
    idle = v[3] + v[4]
    return (sum(v) - idle) / HZ

def wait_quiet(max_wait=600):
    t0 = time.time()
    while True:
        b0 = busy(); time.sleep(2); b1 = busy()
        if (b1 - b0) / 2 < 0.15 or time.time() - t0 > max_wait:
            return (b1 - b0) / 2

configs = [("gemm", 1), ("blis", 1), ("engine", 1), ("gemm", 2), ("blis", 2), ("engine", 2)]
with open(OUT, "a") as out:
    for r in range(ROUNDS):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for lib, th in order:
            pre = wait_quiet()
            env = dict(os.environ, BLIS_NUM_THREADS=str(th), RAYON_NUM_THREADS=str(th))
            ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            b0 = busy(); w0 = time.time()
            p = subprocess.run([BIN, lib, str(th)], env=env, capture_output=True, text=True)
            w1 = time.time(); b1 = busy()
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            own = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
            foreign = max(0.0, (b1 - b0) - own) / (w1 - w0)
            rec = {"round": r, "lib": lib, "threads": th, "wall": w1 - w0, "own_cpu": own,
                   "foreign_cores": round(foreign, 3), "pre_busy": round(pre, 3), "rc": p.returncode,
                   "stderr": p.stderr.strip(), "rows": [l.split("\t") for l in p.stdout.strip().splitlines()],
                   "time": time.strftime("%H:%M:%S")}
            out.write(json.dumps(rec) + "\n"); out.flush()
            print(r, lib, th, f"wall {w1-w0:.1f}s foreign {foreign:.2f} cores, pre {pre:.2f}", p.stderr.strip()[-200:], flush=True)
