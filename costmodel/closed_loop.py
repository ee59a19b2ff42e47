"""A closed-loop benchmark run, simulated the way the calibration predicts one.

``vllm bench serve --max-concurrency C`` and SGLang's ``bench_serving --max-concurrency C`` start
every request task at once and gate them with ``asyncio.Semaphore(C)``: with the default
``--request-rate inf`` every delay is 0 (vLLM ``vllm/benchmarks/serve.py`` ``get_request``:
``delay_ts.append(0)`` when the rate is inf, ``semaphore = asyncio.Semaphore(max_concurrency)``,
commit 009e6d4a; SGLang ``python/sglang/bench_serving.py`` is adapted from the same vLLM script and
gates the same way, commit 0033168f). So C clients send their first requests together and each
sends its next one when its last completes; both clients average over every request of the run
(their warm-up requests, ``--num-warmups`` / ``--warmup-requests``, are a separate run).

What the engine makes of that burst differs, and that is what ``clients`` selects:

- ``staggered``: vLLM V1 and TensorRT-LLM mix prefill chunks into millisecond decode steps and
  start stepping as soon as one request arrives, so the burst splits into groups that finish, and
  resubmit, at different times: a long run is phase-spread, each prompt prefilled beside the
  others' decodes. Simulated by spreading the clients' first sends evenly over one request's
  estimated lifetime. (The shipped H100 fits use it for these engines: profiles/README.md.)
  For vLLM this is the default with a caveat: aiconfigurator's BF16 vLLM silicon runs, launched
  with a small token budget, do not drift apart (their TTFT is a few prefills even at 8 clients
  and flat in the output length); ``--clients burst`` with their budget follows them (TTFT MAPE
  30% over the 93 runs, after a refit, against 56% staggered), while an FP8 run at vLLM's default
  budget of 8,192 tokens (Llama-3.1-70B FP8, TP4, 1024/1024, 16 clients, measured 121 ms) is
  +320% under burst and -40% staggered (bench/RESULTS-ttft.md). Which one a run is depends on
  its launch; choose with ``--clients``.
- ``burst``: SGLang's default scheduler prefills waiting prompts in a batch of their own while the
  decodes wait, which keeps clients that start together in lock-step for the whole run. llama.cpp's
  server on a CPU stays in lock-step too: every waiting prompt joins the next batch (up to ``-b``
  tokens) and its steps take seconds, so no client falls out of phase; on the committed CPU table
  (profiles/tables/smollm2-135m-cpu-llamacpp.csv) a calibration with burst clients fits TTFT /
  TPOT / tok/s at MAPE 17.0 / 18.8 / 13.0% against 25.1 / 30.4 / 16.5% with staggered ones
  (``kvtune calibrate ... --clients burst|staggered``, measured on this repository's CPU table).
  Simulated by sending every client's first request at t = 0.

Each client's next request reaches the engine after the step that starts when its last one
finishes (``costmodel.replica``: the engine schedules that step before the output reaches the
client), so a client whose predecessor finishes beside another's prompt waits for it.

``default_clients(engine)`` is the engine's rule; the calibration (``costmodel.fit.RowPredictor``)
and ``kvtune simulate --concurrency`` both call ``run_closed_loop``, so they give the same number
for the same run. The first C requests (the warm-up, while the clients' phases settle) and the
last C (the drain, while fewer than C clients remain) are left out of the statistics: a long
benchmark's means are dominated by its steady state, which is what kvtune predicts.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .engines import REGISTRY
from .errors import InputError
from .requests import Requests
from .simulate import simulate

__all__ = ["CLIENT_STARTS", "STATS_WINDOWS", "STAGGERED_ENGINES", "default_clients", "client_starts_s", "measured_window",
           "run_closed_loop", "ENGINE_ALIASES", "canonical_engine"]

CLIENT_STARTS = ("burst", "staggered")
# which requests a closed-loop run's statistics cover: ``steady`` leaves out the first and last C
# (warm-up and drain: a long run's steady state); ``whole_run`` counts every request, as a load
# tool whose measured phase starts on an idle engine with all C clients at once does (AIPerf:
# ``TimingManager`` runs its warm-up phase to completion, every credit returned, before the
# profiling phase starts, and the concurrency mode then drops C credits at interval 0 -
# ai-dynamo/aiperf ``aiperf/timing/credit_issuing_strategy.py`` ``_execute_phases``,
# ``request_rate_strategy.py`` ``ConcurrencyBurstRateGenerator``, commit db4f6397; its metrics
# are over every profiling-phase record)
STATS_WINDOWS = ("steady", "whole_run")
# engines whose scheduler mixes prefill chunks into decode steps, so a burst of clients drifts
# apart (see the module doc); the others (SGLang's prefill-first default) stay in lock-step
STAGGERED_ENGINES = frozenset(e.name for e in REGISTRY.values() if e.staggered_clients)  # costmodel.engines
# how engines are spelled in tables and flags -> kvtune's name
ENGINE_ALIASES = {"llama.cpp": "llamacpp", "llama-cpp": "llamacpp", "llama_cpp": "llamacpp",
                  "tensorrt-llm": "trtllm", "tensorrt_llm": "trtllm", "trt-llm": "trtllm"}


def canonical_engine(engine: str | None) -> str | None:
    if not engine:
        return engine
    e = engine.strip().lower()
    return ENGINE_ALIASES.get(e, e)


def default_clients(engine: str | None) -> str:
    """How the clients of an engine's closed-loop benchmark are simulated: ``staggered`` for the
    engines that let a burst drift apart (``STAGGERED_ENGINES``), ``burst`` for the others (SGLang,
    llama.cpp); no engine named: ``staggered`` (vLLM-style scheduling, the simulator's default)."""
    e = canonical_engine(engine)
    return "burst" if e and e not in STAGGERED_ENGINES else "staggered"


def client_starts_s(step, concurrency: int, isl: float, osl: float, cap: int, chunk_tokens: int,
                    clients: str) -> np.ndarray:
    """Send times of the clients' first requests: all 0 (``burst``), or spread evenly over one
    request's estimated lifetime, a prefill alone plus ``osl - 1`` decode steps at batch
    ``min(concurrency, cap)`` (``staggered``)."""
    if clients not in CLIENT_STARTS:
        raise InputError(f"clients must be one of {', '.join(CLIENT_STARTS)}, got {clients!r}")
    starts = np.zeros(concurrency)
    if clients == "staggered" and concurrency > 1:
        isl_i = max(int(round(isl)), 1)
        life_s = (step.prefill_time_s(isl_i, chunk_tokens=chunk_tokens)
                  + max(osl - 1, 0) * step.decode_step(min(concurrency, cap), isl + osl / 2).time_s)
        starts = np.arange(concurrency) * life_s / concurrency
    return starts


def measured_window(n: int, concurrency: int, window: str = "steady") -> np.ndarray:
    """Which of ``n`` requests (in send order) the statistics use: all but the first and the last
    ``concurrency`` (warm-up and drain), or all of them when the run is too short to drop both or
    ``window`` is ``whole_run`` (``STATS_WINDOWS``)."""
    if window not in STATS_WINDOWS:
        raise InputError(f"closed loop: window must be one of {', '.join(STATS_WINDOWS)}, got {window!r}")
    keep = np.zeros(n, dtype=bool)
    if window == "steady" and n > 2 * concurrency:
        keep[concurrency:n - concurrency] = True
    else:
        keep[:] = True
    return keep


def run_closed_loop(step, requests: Requests, config, concurrency: int, clients: str, seed: int = 0,
                    window: str = "steady"):
    """Simulate ``concurrency`` clients working through ``requests`` in order (client ``i`` sends
    request ``i`` first, at ``client_starts_s``; each client's next request goes when its last one
    completes). Returns the simulator's ``SimResult`` with ``measured`` set to
    ``measured_window`` (``window``) and ``slo_attainment`` over those requests."""
    n = len(requests)
    if isinstance(concurrency, bool) or not isinstance(concurrency, (int, np.integer)) or concurrency < 1:
        raise InputError(f"closed loop: concurrency must be an integer >= 1, got {concurrency!r}")
    if n < 1:
        raise InputError("closed loop: no requests to send")
    c = min(int(concurrency), n)
    isl = float(np.mean(requests.input_tokens))
    osl = float(np.mean(requests.output_tokens))
    arrival = np.zeros(n)
    arrival[:c] = client_starts_s(step, c, isl, osl, min(config.batch_cap, c), config.chunk_tokens, clients)
    reqs = dataclasses.replace(requests, arrival_s=arrival)
    res = simulate(step, reqs, config, arrival="closed", concurrency=c, seed=seed, warmup_frac=0.0)
    keep = measured_window(n, c, window)
    att = float(np.mean(np.asarray(res.met_slo)[keep])) if keep.any() else float("nan")
    return dataclasses.replace(res, measured=keep, slo_attainment=att)
