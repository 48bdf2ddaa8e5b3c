"""Load test of `specdec serve`: N clients send chat completions for M seconds (or until R
requests), each starting its next request when the last ends; reports latency percentiles,
throughput, errors, and the server's resident memory (RSS) as the requests go by.

    python benchmarks/load_test.py --model smollm2-135m-instruct --clients 4 --seconds 60
    python benchmarks/load_test.py --url http://127.0.0.1:8000 --clients 8 --requests 1000

With --model it starts `specdec serve` on a free port of 127.0.0.1 itself (and can then read
the server's RSS from /proc); with --url it loads a server already running on this machine.
Needs httpx (the test extra). Only loopback addresses are accepted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional
from urllib.parse import urlparse

import httpx

QUESTIONS = ["Name three rivers.", "What is a prime number?", "Write a haiku about rain.",
             "Explain photosynthesis in one sentence.", "List four colours.",
             "Why is the sky blue?", "Give me a synonym for happy.", "What is 12 times 7?"]


def rss_mb(pid: Optional[int]) -> Optional[float]:
    """Resident memory of process `pid` in MB (Linux /proc), or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def percentile(xs: List[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))] if s else float("nan")


class Load:
    def __init__(self, args: argparse.Namespace, url: str, pid: Optional[int]) -> None:
        self.args, self.url, self.pid = args, url, pid
        self.latency: List[float] = []
        self.first_piece: List[float] = []
        self.tokens = 0
        self.errors: Dict[str, int] = {}
        self.sent = 0
        self.rss: List[tuple] = [(0, rss_mb(pid))]

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1

    async def one(self, http: httpx.AsyncClient, i: int) -> None:
        body = {"model": self.args.name, "max_tokens": self.args.max_tokens,
                "temperature": self.args.temperature, "stream": self.args.stream,
                "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]}
        if self.args.stream:
            body["stream_options"] = {"include_usage": True}
        t0 = time.perf_counter()
        try:
            if self.args.stream:
                async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                    if r.status_code != 200:
                        return self.error(f"HTTP {r.status_code}")
                    first = None
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if "error" in chunk:
                            return self.error("error event")
                        if first is None and chunk["choices"] and \
                                chunk["choices"][0]["delta"].get("content"):
                            first = time.perf_counter() - t0
                        if chunk.get("usage"):
                            self.tokens += chunk["usage"]["completion_tokens"]
                    if first is not None:
                        self.first_piece.append(first)
            else:
                r = await http.post("/v1/chat/completions", json=body)
                if r.status_code != 200:
                    return self.error(f"HTTP {r.status_code}")
                self.tokens += r.json()["usage"]["completion_tokens"]
        except httpx.HTTPError as e:
            return self.error(type(e).__name__)
        self.latency.append(time.perf_counter() - t0)

    async def client(self, http: httpx.AsyncClient, deadline: float) -> None:
        while time.perf_counter() < deadline and self.sent < self.args.requests:
            i = self.sent
            self.sent += 1
            await self.one(http, i)
            done = len(self.latency) + sum(self.errors.values())
            if done % self.args.rss_every == 0:
                self.rss.append((done, rss_mb(self.pid)))

    async def run(self) -> float:
        t0 = time.perf_counter()
        limits = httpx.Limits(max_connections=self.args.clients)
        async with httpx.AsyncClient(base_url=self.url, timeout=self.args.timeout,
                                     limits=limits, trust_env=False) as http:
            await asyncio.gather(*(self.client(http, t0 + self.args.seconds)
                                   for _ in range(self.args.clients)))
        self.rss.append((len(self.latency) + sum(self.errors.values()), rss_mb(self.pid)))
        return time.perf_counter() - t0

    def report(self, wall: float) -> dict:
        n = len(self.latency)
        lat = {f"p{q}": percentile(self.latency, q) for q in (50, 90, 99)}
        out = {"clients": self.args.clients, "wall_s": wall, "requests_ok": n,
               "errors": self.errors, "requests_per_s": n / wall,
               "completion_tokens_per_s": self.tokens / wall, "latency_s": lat,
               "latency_max_s": max(self.latency, default=float("nan")),
               "rss_mb": [(k, None if v is None else round(v, 1)) for k, v in self.rss]}
        if self.first_piece:
            out["first_piece_s"] = {f"p{q}": percentile(self.first_piece, q) for q in (50, 90)}
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace) -> tuple:
    port = free_port()
    cmd = [sys.executable, "-m", "specdec", "serve", "--model", args.model, "--port", str(port),
           "--speculator", args.speculator, "--log-level", "warning"]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    with httpx.Client(trust_env=False) as h:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited with status {proc.returncode}")
            if time.monotonic() > deadline:
                proc.terminate()
                raise SystemExit("the server did not come up within 300 s")
            try:
                if h.get(url + "/health").status_code == 200:
                    return proc, url
            except httpx.TransportError:
                time.sleep(0.2)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--model", help="start `specdec serve --model MODEL` for the test")
    where.add_argument("--url", help="a running server on this machine, e.g. "
                                     "http://127.0.0.1:8000")
    p.add_argument("--speculator", default="prompt-lookup", help="with --model")
    p.add_argument("--threads", type=int, default=None, help="with --model")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--requests", type=int, default=1000, help="stop after this many requests")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--stream", action="store_true", help="streamed requests (SSE)")
    p.add_argument("--timeout", type=float, default=120.0, help="per request, seconds")
    p.add_argument("--rss-every", type=int, default=100, help="sample RSS every N requests")
    p.add_argument("--server-pid", type=int, default=None, help="with --url: whose RSS to read")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    proc = None
    if args.model:
        proc, url = start_server(args)
        pid: Optional[int] = proc.pid
    else:
        url, pid = args.url.rstrip("/"), args.server_pid
        host = urlparse(url).hostname or ""
        if not (host == "localhost" or host.startswith("127.") or host == "::1"):
            p.error("--url must be a loopback address (127.0.0.0/8, localhost or [::1])")
    try:
        with httpx.Client(base_url=url, trust_env=False) as h:
            args.name = h.get("/v1/models").json()["data"][0]["id"]
        load = Load(args, url, pid)
        rep = load.report(asyncio.run(load.run()))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    if args.json:
        print(json.dumps(rep, indent=2))
        return 0
    lat = rep["latency_s"]
    print(f"{rep['clients']} clients, {rep['wall_s']:.1f} s: {rep['requests_ok']} requests ok, "
          f"errors {rep['errors'] or 'none'}")
    print(f"throughput : {rep['requests_per_s']:.2f} requests/s, "
          f"{rep['completion_tokens_per_s']:.1f} completion tokens/s")
    print(f"latency    : p50 {lat['p50']:.3f} s, p90 {lat['p90']:.3f} s, p99 {lat['p99']:.3f} s, "
          f"max {rep['latency_max_s']:.3f} s")
    if "first_piece_s" in rep:
        fp = rep["first_piece_s"]
        print(f"first text : p50 {fp['p50']:.3f} s, p90 {fp['p90']:.3f} s")
    rss = [(k, v) for k, v in rep["rss_mb"] if v is not None]
    if rss:
        print("server RSS : " + ", ".join(f"{v:.1f} MB after {k}" for k, v in rss))
    return 1 if rep["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
