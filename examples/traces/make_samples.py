"""Write the small sample traces beside this script, deterministically (seed 0).

    python examples/traces/make_samples.py

The shapes imitate the public traces, at a few hundred rows each; they are synthetic, not
excerpts:
  azure_conv_sample.csv     Azure LLM inference 2023 "conversation" trace: ~5 req/s, bursty
                            arrivals, prompts lognormal around 1k tokens, replies a few hundred
  mooncake_sample.jsonl     Mooncake (Kimi) trace: long prompts built from 512-token blocks; a few
                            shared system prompts and multi-turn sessions that extend earlier turns
  burstgpt_sample.csv       BurstGPT: ChatGPT and GPT-4 rows, conversation and API logs, ~4% failed
                            requests logged with 0 response tokens
"""

from __future__ import annotations

import csv
import datetime as dt
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROWS = 300
BLOCK = 512  # tokens per Mooncake hash block


def _bursty_gaps(rng: np.random.Generator, n: int, rate_req_s: float) -> np.ndarray:
    """Inter-arrival gaps of a two-state (calm/burst) Poisson process averaging ``rate_req_s``."""
    burst = rng.random(n) < 0.2
    return rng.exponential(np.where(burst, 0.25, 1.19) / rate_req_s)


def azure(rng: np.random.Generator) -> None:
    start = dt.datetime(2023, 11, 16, 18, 15, 46)
    t_s = np.cumsum(_bursty_gaps(rng, ROWS, 5.4))
    ctx = np.clip(np.rint(rng.lognormal(np.log(1000), 0.9, ROWS)), 2, 16000).astype(int)
    gen = np.clip(np.rint(rng.lognormal(np.log(180), 0.9, ROWS)), 1, 2000).astype(int)
    with (HERE / "azure_conv_sample.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for t, c, g in zip(t_s, ctx, gen):
            ticks = int(round(t * 1e7))  # Azure writes 7 fractional digits (100 ns ticks)
            stamp = (start + dt.timedelta(seconds=ticks // 10**7)).strftime("%Y-%m-%d %H:%M:%S")
            w.writerow([f"{stamp}.{ticks % 10**7:07d}", c, g])


def mooncake(rng: np.random.Generator) -> None:
    next_id = 0

    def new_blocks(k: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + k))
        next_id += k
        return ids

    system = [new_blocks(int(k)) for k in rng.integers(2, 9, size=4)]  # 4 system prompts, 1k-4k tokens
    sessions: list[list[int]] = []  # the blocks of each open conversation so far
    t_ms = 0.0
    with (HERE / "mooncake_sample.jsonl").open("w") as f:
        for _ in range(ROWS):
            t_ms += rng.exponential(1000 / 3.0)  # ~3 req/s
            if sessions and rng.random() < 0.45:  # next turn of an open conversation
                s = int(rng.integers(len(sessions)))
                blocks = sessions[s] + new_blocks(int(rng.integers(1, 4)))
                sessions[s] = blocks
            else:  # a new conversation on one of the system prompts, or a one-off document
                head = system[int(rng.integers(len(system)))] if rng.random() < 0.8 else []
                blocks = head + new_blocks(int(rng.integers(1, 12)))
                sessions.append(blocks)
                if len(sessions) > 12:
                    sessions.pop(0)
            tail = int(rng.integers(1, BLOCK + 1))  # the last block is partly filled
            row = {"timestamp": int(t_ms), "input_length": (len(blocks) - 1) * BLOCK + tail,
                   "output_length": int(np.clip(rng.lognormal(np.log(150), 0.8), 1, 2000)), "hash_ids": blocks}
            f.write(json.dumps(row) + "\n")


def burstgpt(rng: np.random.Generator) -> None:
    t_s = np.cumsum(_bursty_gaps(rng, ROWS, 1.5))
    with (HERE / "burstgpt_sample.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"])
        for t in t_s:
            model = "ChatGPT" if rng.random() < 0.75 else "GPT-4"
            log = "Conversation log" if rng.random() < 0.6 else "API log"
            req = int(np.clip(rng.lognormal(np.log(600), 1.0), 1, 30000))
            resp = 0 if rng.random() < 0.04 else int(np.clip(rng.lognormal(np.log(250), 0.8), 1, 4000))
            w.writerow([f"{t:.1f}", model, req, resp, req + resp, log])


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    azure(rng)
    mooncake(rng)
    burstgpt(rng)
