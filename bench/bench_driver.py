"""How well kvtune's open-loop driver keeps time at tens to hundreds of requests per second.

Starts the fake engine (``tests/fake_engine.py``: an OpenAI-compatible server whose every streamed
request appends, to ``KVTUNE_FAKE_TIMING_LOG``, when it was received and when its first and last
text chunks were written) and sends it a workload's Poisson arrivals with ``run_open_loop`` at each
rate. Per request, three clocks are compared:

- **send lateness**: when the driver sent the request against when the plan scheduled it
  (``sent_s - scheduled_s``; the driver's own clock);
- **send to server**: when the server had read the request against when the driver sent it
  (Unix time on both sides, one machine: the request's transmission plus the server's parsing);
- **first and last token**: when the driver saw the first and the last text chunk against when
  the server wrote them (the driver's SSE timestamps' error: delivery plus parsing).

Requests are paired with the server's log by the order they were received in and their prompt
length. Figures are measured on this machine, which is shared: they carry the load average.

Usage: python bench/bench_driver.py [--rates 50,100,200] [--seconds 10] [--md bench/RESULTS-driver.md]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import fake_engine  # noqa: E402

from kvtune.optimizer.loadgen import OpenLoopPlan, run_open_loop  # noqa: E402
from kvtune.optimizer.profile_run import Endpoint  # noqa: E402
from kvtune.optimizer.workload import load_workload  # noqa: E402

# A workload the fake engine serves fast at 200 req/s with 64 slots: short prompts, 8 tokens out,
# SLOs loose enough that every request counts (the bench measures the clock, not the engine).
WORKLOAD = """\
model: smollm2-135m
weights: q4_1
engine: llamacpp
hardware: {{gpu: {hw}, gpus_per_node: 1, usd_per_gpu_hour: 0.05, max_nodes: 1}}
workload:
  rate_req_s: 100
  classes: [{{name: chat, share: 1.0, input_tokens: {{dist: uniform, min: 16, max: 32}}, output_tokens: 8}}]
slo: {{ttft_ms: 5000, tpot_ms: 1000, attainment: 0.9}}
"""
# the fake engine's cost: a 1 ms step, so 64 sequences decode at ~8 ms per token (not the bench's subject)
FAST_COST = {"base_ms": 1.0, "seq_ms": 0.05, "prefill_ms_per_tok": 0.01, "ctx_us_per_tok": 0.0}


@contextlib.contextmanager
def fake_server(tmp: Path, timing_log: Path):
    shims = fake_engine.write_shims(tmp / "shims")
    gguf = tmp / "model.gguf"
    gguf.write_bytes(b"GGUF fake")
    env = {**os.environ, "KVTUNE_FAKE_TIMING_LOG": str(timing_log), "KVTUNE_FAKE_COST": json.dumps(FAST_COST)}
    with fake_engine.serving(shims["llama-server"], "-m", str(gguf), "-np", "64", "-c", "65536", "-kvu", "-cb",
                             env=env) as url:
        yield url


def pair(run, server: list[dict]) -> list[tuple[object, dict]]:
    """Each sent request with the server's line for it: in the order the server received them,
    the driver's requests in the order they were sent, matched on prompt length within a window."""
    rs = sorted((r for r in run.requests if r.sent_s is not None and r.ok), key=lambda r: r.sent_s)
    ss = sorted(server, key=lambda d: d["received_unix"])
    out, used = [], set()
    for r in rs:
        want = run.clock_zero_unix + r.sent_s
        best = None
        for j, d in enumerate(ss):
            if j in used or d["prompt_words"] != (r.prompt_tokens_server or r.input_tokens):
                continue
            gap = d["received_unix"] - want
            if -0.001 <= gap < 0.5 and (best is None or gap < best[1]):
                best = (j, gap)
            if gap >= 0.5:
                break
        if best is not None:
            used.add(best[0])
            out.append((r, ss[best[0]]))
    return out


def q(vals: list[float]) -> str:
    a = np.asarray(vals)
    return " | ".join(f"{np.percentile(a, p):.3f}" for p in (50, 90, 99)) + f" | {a.max():.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="50,100,200", help="Arrival rates, req/s.")
    ap.add_argument("--seconds", type=float, default=10.0, help="Seconds of arrivals per rate.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--md", type=Path, default=None, help="Also write the table to this markdown file.")
    a = ap.parse_args(argv)
    rates = [float(x) for x in a.rates.split(",")]
    lines = ["| rate req/s | requests (sent, paired) | what | p50 ms | p90 ms | p99 ms | max ms | loadavg 1m |",
             "|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "w.yaml").write_text(WORKLOAD.format(hw=REPO / "tests" / "data" / "fake-cpu.yaml"))
        spec = load_workload(tmp / "w.yaml")
        for rate in rates:
            log = tmp / f"timing-{rate:g}.jsonl"
            with fake_server(tmp, log) as url:
                n = int(rate * a.seconds)
                plan = OpenLoopPlan.from_workload(spec, rate, n, a.seed, 0)
                run = run_open_loop(Endpoint(url), "smollm2-135m", plan, timeout_s=30)
            server = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
            pairs = pair(run, server)
            late = [(r.sent_s - r.scheduled_s) * 1e3 for r in run.requests if r.sent_s is not None]
            to_srv = [(d["received_unix"] - (run.clock_zero_unix + r.sent_s)) * 1e3 for r, d in pairs]
            first = [((run.clock_zero_unix + r.sent_s + r.ttft_ms / 1e3) - d["first_unix"]) * 1e3 for r, d in pairs]
            last = [((run.clock_zero_unix + r.sent_s + r.e2e_ms / 1e3) - d["last_unix"]) * 1e3 for r, d in pairs]
            load = f"{run.load.mean_1m:.2f}"
            head = f"| {rate:g} (sent {run.offered_rate_req_s:.1f}) | {len(late)}, {len(pairs)} |"
            for what, vals in (("send lateness (driver)", late), ("send to server received", to_srv),
                               ("first token: driver saw - server wrote", first),
                               ("last token: driver saw - server wrote", last)):
                lines.append(f"{head} {what} | {q(vals) if vals else '- | - | - | -'} | {load} |")
            if run.failures:
                lines.append(f"{head} failed | {len(run.failures)}: {run.failures[0].error} | | | | |")
    cpu = os.cpu_count()
    text = "\n".join(lines)
    print(text)
    if a.md:
        a.md.write_text("# The open-loop driver's clock against the fake engine's (measured)\n\n"
                        f"`python bench/bench_driver.py --rates {a.rates} --seconds {a.seconds:g}` on "
                        f"{cpu} CPUs, {time.strftime('%Y-%m-%d', time.gmtime())}; the fake engine runs on the "
                        "same machine (Unix time on both sides). Milliseconds.\n\n" + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
