"""Decode step time on the live llama-server by batch and context (measured): sequences started
together with equal n_predict, greedy, no prompt cache, each on its own slot; the server's own
``timings`` per request. Long prompts in one batch prefill one after another (-b 1024), so a row
with two long prompts mixes a wait into the first one's figure: read the rows with at most one.

Usage: python bench/probe_llamacpp_steps.py LLAMA_SERVER GGUF [extra server flags]
(the two paths ``python bench/live_server.py --print-paths`` prints). Last run: bench/RESULTS-overload.md.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.request

PORT = 18933
WORDS = "apple river stone cloud market garden silver window orange planet music letter forest bridge engine paper".split()
BATCHES = ([8], [200], [8, 8], [8, 200], [8, 8, 8], [8, 8, 200])   # prompt words per sequence (~4 tokens a word)


def prompt(n_words: int, seed: int) -> str:
    r = random.Random(seed)
    return " ".join(r.choice(WORDS) + str(r.randint(0, 999)) for _ in range(n_words))


def post(body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as f:
        return json.load(f)


def main(argv: list[str]) -> int:
    binary, gguf = argv[0], argv[1]
    srv = subprocess.Popen([binary, "-m", gguf, "-np", "4", "-c", "8192", "-b", "1024", "-t", "1", "--port", str(PORT),
                            *argv[2:]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        post({"prompt": prompt(10, 0), "n_predict": 4})
        print("| batch | prompt tokens | decode ms/token (server timings) | loadavg 1m |")
        print("|---|---|---|---|")
        for k, words in enumerate(BATCHES):
            out: dict[int, tuple[int, float]] = {}

            def one(j: int, w: int, k: int = k, out: dict = out) -> None:
                t = post({"prompt": prompt(w, 1000 * k + j), "n_predict": 80, "temperature": 0, "cache_prompt": False,
                          "ignore_eos": True, "id_slot": j})["timings"]
                out[j] = (t["prompt_n"], t["predicted_ms"] / t["predicted_n"])
            th = [threading.Thread(target=one, args=(j, w)) for j, w in enumerate(words)]
            for t in th:
                t.start()
            for t in th:
                t.join()
            print(f"| {len(words)} | {', '.join(str(out[j][0]) for j in sorted(out))} | "
                  f"{', '.join(f'{out[j][1]:.2f}' for j in sorted(out))} | {os.getloadavg()[0]:.2f} |", flush=True)
    finally:
        srv.terminate()
        srv.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
