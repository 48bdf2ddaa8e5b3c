"""How fast this machine streams memory: the ceiling of one-token decoding on a CPU.

Reads a buffer the size of a model's weights (default 96 MiB, SmolLM2-135M's repacked copy)
from one and from several threads at once, each summing its share (NumPy's sum releases the
GIL), and prints the best of `--repeats` runs in GB/s. A decode step reads every weight once,
so weight bytes / this rate is the least time a token can take.

    python benchmarks/mem_bandwidth.py [--mib 96] [--threads 1,2] [--repeats 10]
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np


def stream_once(parts) -> float:
    """Seconds for len(parts) threads to sum their parts at once."""
    barrier = threading.Barrier(len(parts) + 1)

    def work(a):
        barrier.wait()
        a.sum()

    threads = [threading.Thread(target=work, args=(a,)) for a in parts]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=96, help="buffer size in MiB")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    n = args.mib * (1 << 20) // 8
    buf = np.ones(n, dtype=np.uint64)  # written once: every page is backed before timing
    print(f"| threads | GB/s | ms for {args.mib} MiB |")
    print("|---|---|---|")
    for k in (int(x) for x in args.threads.split(",")):
        parts = np.array_split(buf, k)
        best = min(stream_once(parts) for _ in range(args.repeats))
        print(f"| {k} | {buf.nbytes / best / 1e9:.1f} | {best * 1e3:.2f} |")


if __name__ == "__main__":
    main()
