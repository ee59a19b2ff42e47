"""One serving replica (a TP group running one engine): its state and its step loop.

``costmodel.simulate`` prepares the requests (``ReplicaInputs``), builds a ``Replica`` with the
engine's scheduling and admission policies (``costmodel.engines``) and calls ``run()``; the
replica fills in each request's first-token and finish times. One turn of the loop (``run``), in
order:

1. arrivals: requests that have arrived join the waiting queue; rejected ones (they can never fit
   the pool) leave it at once (``_reject_head``); an idle engine jumps to the next arrival (and
   the admission policy hears of it: ``on_idle``);
2. room: the blocks the decoding sequences need for this step (an upper bound first, the exact
   count, ``dec_blocks``, only when the bound does not fit); while they do not fit, the most
   recently admitted request is preempted (``_make_room``, ``_preempt``: vLLM's RECOMPUTE,
   SGLang's retraction);
3. prompt chunks (``_admit``): the scheduling policy's token budget goes to the running
   prompts first, then to the head of the waiting queue (FCFS) while the batch cap, the KV pool
   and the admission policy allow;
4. time advances by one of: a run of identical-shape mixed steps summed in closed form
   (``_chunk_run_length``, ``_chunk_run``), one explicit step carrying prompt chunks (a prompt
   that completes emits its first token and starts decoding), or pure decode steps up to the next
   event summed by ``DecodeClock`` (``_first_short_step`` stops a run before the pool runs out);
5. completions: sequences whose last step has run finish; a closed-loop client sends its next
   request (``_on_done``), which reaches the scheduler after the step that starts now: it joins
   the waiting queue at the next step boundary, never the step already scheduled.

Phases 1, 4 and 5 run once per event and are written out in ``run`` over local variables; the
rest are methods. State, in the units the loop counts: ``t`` (seconds), ``gstep`` (engine steps so
far; every step decodes every decoding sequence). The decoding sequences are kept as aggregates:
``n_dec``, ``ctx_sum`` (their cached tokens), ``G`` (their growth per step), ``shared_dec``
(prefix-cache blocks they borrow), and per-slot arrays (``sL0`` context at step ``sS0``, gain
``sg``, borrowed blocks ``ssh``, finish step ``sF``) for the exact block count. A heap keyed by
finish step gives the completions. Per-request state lives in Python lists indexed by request.

A replica reads its arrivals from ``ReplicaInputs`` and writes its results there; a deployment of
several pools (a prefill pool handing its KV to a decode pool) would feed requests to each
replica's waiting queue and read their first-token and finish times the same way.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque
from dataclasses import dataclass

import numpy as np

from .engines import Admission, Scheduling
from .engines.policies import RESERVE_RATIO_INIT
from .sim_clock import clock_for
from .step import StepCost

__all__ = ["ReplicaInputs", "Replica"]

_STEPS_OVER: dict[int, np.ndarray] = {}


def _steps_over(m: int, k: int) -> np.ndarray:
    """``np.arange(m) / k`` (k = m - 1: a chunk run's steps as fractions of its last), built once
    per run length and read-only (``_chunk_run`` meets the same lengths thousands of times)."""
    j = _STEPS_OVER.get(m)
    if j is None:
        j = np.arange(m) / k
        j.flags.writeable = False
        if len(_STEPS_OVER) < 4096:
            _STEPS_OVER[m] = j
    return j


@dataclass
class ReplicaInputs:
    """Per-request inputs in arrival order (lists), and where the replica writes its results."""

    inp: list            # prompt tokens
    out: list            # output tokens
    pre: list            # prefix tokens shared with the request's prefix group
    grp: list            # prefix group (-1: none)
    arr: list            # arrival times (closed loop: rewritten when a client sends)
    nsteps: list         # decode (verify) steps after the first token
    gain: list           # tokens each decode step adds to the sequence's context
    rejected: list       # can never fit the pool: never served
    n_trace: int         # requests that arrive at their own arr[i] (the rest: at once, or by clients)
    clients: int         # closed loop: clients (0: open loop)
    all_at_once: bool    # offline: every request waits at t=0
    # True where the request's prompt KV arrives computed (a disaggregated decode replica); None: none
    kv_ready: list | None = None


class Replica:
    """One replica's scheduler state and step loop (see the module docstring)."""

    # slots: the loop reads and writes these attributes on every event (a dict of ~70 keys is slower)
    __slots__ = (
        # inputs, per request
        "n", "inp", "out", "pre", "grp", "arr", "nsteps", "gain", "rejected", "any_rejected", "n_trace", "kv_ready",
        # the engine and its policies
        "step", "q", "bt", "cap", "chunk", "use_prefix", "total_blocks", "watermark_blocks", "scheduling",
        "admission", "mixed", "budget_per_decode", "reserve", "chunk_runs", "naive", "step_time", "pieces_of",
        "time_of", "steps_until", "unit_gain", "pcs", "pcs_n",
        # time and the decoding aggregates
        "t", "gstep", "ctx_sum", "G", "n_dec", "shared_dec",
        # decode slots
        "slot_w", "sL0", "sS0", "sg", "ssh", "sF", "free_slots", "active", "top",
        # per-request state
        "slot_of", "L0_of", "S0_of", "heap", "epoch", "running", "prefilling", "pf_done", "pf_target", "pf_alloc",
        "alloc_pf", "shared_of", "pinned", "cached_groups", "steps_done", "waiting", "first_t", "fin_t",
        # counters, arrivals, SGLang's ratio
        "preemptions", "events", "n_left", "nxt", "nxt_c", "nt_r0", "nt_s0",
    )

    def __init__(self, step: StepCost, inputs: ReplicaInputs, *, batch_cap: int, chunk_tokens: int, block_tokens: int,
                 prefix_caching: bool, total_blocks: int, watermark_blocks: int,
                 scheduling: Scheduling, admission: Admission, naive: bool):
        x = inputs
        n = len(x.inp)
        self.n = n
        self.inp, self.out, self.pre, self.grp = x.inp, x.out, x.pre, x.grp
        self.arr = x.arr
        self.nsteps, self.gain, self.rejected = x.nsteps, x.gain, x.rejected
        self.kv_ready = list(x.kv_ready) if x.kv_ready is not None else None
        self.any_rejected = any(x.rejected)
        self.n_trace = x.n_trace
        self.step = step
        self.q = step.verify_tokens_per_seq
        self.bt, self.cap, self.chunk = int(block_tokens), int(batch_cap), int(chunk_tokens)
        self.use_prefix = bool(prefix_caching)
        self.total_blocks, self.watermark_blocks = int(total_blocks), int(watermark_blocks)
        self.scheduling, self.admission = scheduling, admission
        self.mixed = scheduling.decodes_with_prefill
        # prompt tokens per step: chunk_tokens less this many per decoding sequence
        self.budget_per_decode = self.q if scheduling.budget_counts_decodes else 0
        self.reserve = admission.varies_per_step
        # runs of identical prompt chunks beside a fixed decode set are summed in closed form too:
        # every term of those steps is linear in the step index (not for sliding-window attention,
        # whose KV reads are not, nor speculation, whose draft cost takes its own max)
        self.chunk_runs = (not naive and scheduling.chunk_runs_ok and step.speculation is None
                           and not step.has_sliding_window)
        self.naive = naive
        self.step_time = step.step_time_s
        clock = clock_for(step)  # shared by every simulation of this step model
        self.pieces_of = clock.pieces
        self.time_of, self.steps_until = clock.time_of_steps, clock.steps_until
        self.pcs, self.pcs_n = None, -1  # the clock's pieces for a decode batch of pcs_n sequences

        # ---- time and the decoding aggregates ----
        self.t = 0.0
        self.gstep = 0
        self.ctx_sum = 0.0
        self.G = 0.0
        self.n_dec = 0
        self.shared_dec = 0
        # ---- decode slots: inactive ones have L0 = -1, g = 0, shared = 0 so they need 0 blocks ----
        # written through ``slot_w`` (array.array: a scalar store is half numpy's cost), read as
        # numpy views of the same memory: context sL0 at step sS0, gain sg, borrowed blocks ssh,
        # finish step sF
        cap = self.cap
        self.slot_w = tuple(array("d", [v]) * cap for v in (-1.0, 0.0, 0.0, 0.0, 0.0))
        self.sL0, self.sS0, self.sg, self.ssh, self.sF = (np.frombuffer(w, dtype=np.float64) for w in self.slot_w)
        self.free_slots = list(range(cap))  # a heap: the lowest free slot first keeps active slots packed
        self.active = [False] * cap
        self.top = 0                        # 1 + highest slot in use: numpy work covers slots [:top]
        self.unit_gain = step.speculation is None
        # ---- per request ----
        self.slot_of = [-1] * n
        self.L0_of = [0.0] * n
        self.S0_of = [0] * n
        self.heap: list = []                # (finish step, request, epoch)
        self.epoch = [0] * n
        self.running: dict[int, None] = {}  # admission order (preemption victim: the last one)
        self.prefilling: list[int] = []
        self.pf_done = [0] * n
        self.pf_target = [0] * n
        self.pf_alloc = [0] * n
        self.alloc_pf = 0                   # blocks held by prefilling requests
        self.shared_of = [0] * n
        self.pinned = 0                     # blocks of cached prefixes
        self.cached_groups: set[int] = set()
        self.steps_done = [0] * n
        self.waiting: deque[int] = deque()
        self.first_t = [math.nan] * n
        self.fin_t = [math.nan] * n
        self.preemptions = 0
        self.events = 0
        self.n_left = n
        self.nxt = 0                        # next request not yet arrived
        self.nt_r0, self.nt_s0 = RESERVE_RATIO_INIT, 0  # SGLang's new_token_ratio: its value at step nt_s0
        if x.all_at_once:
            self.nxt = n
            self.waiting.extend(range(n))
        elif x.clients and self.n_trace == 0:
            self.waiting.extend(range(x.clients))
            self.nxt = x.clients
            self.n_trace = x.clients  # the burst has arrived; the clients' next requests follow (_on_done)
        self.nxt_c = x.clients if x.clients else n  # the next request a closed-loop client sends

    # ---- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        """The step loop. Its hot state (time, step count, the decoding aggregates, the pool's
        counters) is held in local variables, the common phases are written out here and the rare
        ones are methods: ``_sync`` writes the locals to the replica before such a call, and the
        locals are read back after it (the loop runs once per event: its speed is the simulator's)."""
        waiting, prefilling, heap, arr, epoch = self.waiting, self.prefilling, self.heap, self.arr, self.epoch
        running, rejected, any_rejected = self.running, self.rejected, self.any_rejected
        chunk, per_decode, chunk_runs, mixed = self.chunk, self.budget_per_decode, self.chunk_runs, self.mixed
        n_trace, bt, total_blocks, cap, n = self.n_trace, self.bt, self.total_blocks, self.cap, self.n
        naive, reserve, pieces_of, steps_until, time_of = (self.naive, self.reserve, self.pieces_of, self.steps_until,
                                                           self.time_of)
        step_time, use_prefix, cached_groups, admission = self.step_time, self.use_prefix, self.cached_groups, self.admission
        pf_done, pf_target, pf_alloc, pre, grp = self.pf_done, self.pf_target, self.pf_alloc, self.pre, self.grp
        first_t, fin_t, nsteps, steps_done, gain = self.first_t, self.fin_t, self.nsteps, self.steps_done, self.gain
        free_slots, active, slot_of, shared_of = self.free_slots, self.active, self.slot_of, self.shared_of
        L0_of, S0_of = self.L0_of, self.S0_of
        w0, w1, w2, w3, w4 = self.slot_w
        pcs_n, pcs = -1, None
        t, gstep, ctx_sum, G, n_dec, shared_dec = self.t, self.gstep, self.ctx_sum, self.G, self.n_dec, self.shared_dec
        alloc_pf, pinned, top, n_left, nxt, events = (self.alloc_pf, self.pinned, self.top, self.n_left, self.nxt,
                                                      self.events)
        sync = self._sync
        kv_given = self.kv_ready is not None
        while n_left > 0:
            events += 1
            n_trace = self.n_trace  # grows in a closed loop: a client's next request is a timed arrival (_on_done)
            # ---- 1. arrivals up to now join the waiting queue ----------------------------------
            while nxt < n_trace and arr[nxt] <= t:
                waiting.append(nxt)
                nxt += 1
            if any_rejected and waiting and rejected[waiting[0]]:
                sync(t, gstep, ctx_sum, G, n_dec, shared_dec, alloc_pf, pinned, top, n_left, nxt)
                self._reject_head()
                n_left = self.n_left
                if n_left == 0:
                    break
            if not running and not waiting:
                t = arr[nxt]  # idle until the next arrival (trace mode only reaches here)
                if reserve:
                    self.gstep = gstep
                    admission.on_idle(self)
                continue
            # ---- 2. room for this step's decodes ------------------------------------------------
            preempted = False
            if n_dec and (ctx_sum + n_dec) / bt + n_dec - shared_dec + alloc_pf + pinned > total_blocks:
                sync(t, gstep, ctx_sum, G, n_dec, shared_dec, alloc_pf, pinned, top, n_left, nxt)
                preempted = self._make_room()
                ctx_sum, G, n_dec, shared_dec = self.ctx_sum, self.G, self.n_dec, self.shared_dec
                alloc_pf, pinned, top = self.alloc_pf, self.pinned, self.top
            # ---- 3. prompt chunks within the scheduling policy's budget ---------------------------
            budget = chunk - n_dec * per_decode
            ptoks = 0
            if budget > 0 and (prefilling or waiting):
                ppairs = 0.0
                pkv = 0.0
                chunks = []
                for i in prefilling:  # the running prompts first, in admission order
                    d = pf_done[i]
                    c = pf_target[i] - d
                    if c > budget:
                        c = budget
                    ptoks += c
                    ppairs += c * d + c * (c + 1) * 0.5
                    pkv += d
                    chunks.append((i, c))
                    budget -= c
                    if budget <= 0:
                        break
                # vLLM V1 admits nothing in a step that had to preempt (the victim would come straight back)
                if budget > 0 and waiting and len(running) < cap and not preempted:
                    sync(t, gstep, ctx_sum, G, n_dec, shared_dec, alloc_pf, pinned, top, n_left, nxt)
                    ptoks, ppairs, pkv, budget = self._admit(chunks, ptoks, ppairs, pkv, budget)
                    alloc_pf, pinned, n_left = self.alloc_pf, self.pinned, self.n_left
                    if kv_given:  # requests whose KV arrived may have joined the decoding set
                        ctx_sum, G, n_dec, shared_dec, top = self.ctx_sum, self.G, self.n_dec, self.shared_dec, self.top
            # ---- 4. time advances ------------------------------------------------------------------
            if ptoks > 0:
                if chunk_runs and budget == 0 and len(chunks) == 1 and not preempted:
                    # one prompt takes the whole budget: the next steps may repeat this one's shape
                    sync(t, gstep, ctx_sum, G, n_dec, shared_dec, alloc_pf, pinned, top, n_left, nxt)
                    m = self._chunk_run_length(chunks[0])
                else:
                    m = 1
                if m > 1:
                    self._chunk_run(chunks[0], m)
                    t, gstep, ctx_sum = self.t, self.gstep, self.ctx_sum
                else:
                    # one explicit step: mixed with the decodes, or prefill only (the decodes wait)
                    if mixed:
                        t += step_time(n_dec, ctx_sum, ptoks, ppairs, pkv)
                        gstep += 1
                        ctx_sum += G
                    else:
                        t += step_time(0, 0.0, ptoks, ppairs, pkv)
                    for i, c in chunks:
                        d = pf_done[i] + c
                        pf_done[i] = d
                        if d < pf_target[i]:
                            continue
                        # the prompt is done: cache its prefix, emit its first token, start decoding
                        prefilling.remove(i)
                        alloc_pf -= pf_alloc[i]
                        if use_prefix and pre[i] > 0 and grp[i] >= 0 and grp[i] not in cached_groups:
                            pb = -(-pre[i] // bt)
                            dec_bound = (ctx_sum + n_dec) / bt + n_dec - shared_dec
                            if dec_bound + alloc_pf + pinned + pb + -(-(d + 1) // bt) <= total_blocks:
                                cached_groups.add(grp[i])
                                pinned += pb
                        if first_t[i] != first_t[i]:  # NaN: the first token of this request
                            first_t[i] = t
                        left = nsteps[i] - steps_done[i]
                        if left <= 0:
                            fin_t[i] = t
                            del running[i]
                            n_left -= 1
                            if self.nxt_c < n:
                                self.t = t
                                self._on_done(i)
                            continue
                        s = heapq.heappop(free_slots)  # the lowest free slot: active slots stay packed
                        active[s] = True
                        if s >= top:
                            top = s + 1
                        slot_of[i] = s
                        g = gain[i]
                        sh = shared_of[i]
                        L0_of[i], S0_of[i] = float(d), gstep
                        w0[s], w1[s], w2[s], w3[s], w4[s] = float(d), gstep, g, sh, gstep + left
                        ctx_sum += d
                        G += g
                        n_dec += 1
                        shared_dec += sh
                        heapq.heappush(heap, (gstep + left, i, epoch[i]))
            elif n_dec:
                # pure decode steps up to the next event (a completion, an arrival that could be
                # admitted, or block pressure), summed in closed form by DecodeClock
                while heap[0][2] != epoch[heap[0][1]]:
                    heapq.heappop(heap)
                m = heap[0][0] - gstep                        # steps until the first completion
                if n_dec != pcs_n:
                    pcs = None if naive else pieces_of(n_dec)
                    pcs_n = n_dec
                if pcs is None or (preempted and waiting):
                    m = 1  # after a preemption the next step may admit again: no run ahead
                elif reserve and waiting and len(running) < cap:
                    m = 1  # the output reserve shrinks step by step: the head may be admitted at any step
                elif not waiting and nxt < n_trace:
                    # the next arrival joins after the step during which it arrives
                    tau = arr[nxt] - t
                    if len(pcs) == 1:
                        # one linear piece (the common case): S(k) = k a1 + b1 k (k - 1) / 2, solved inline
                        _, a, b = pcs[0]
                        a1 = a + b * ctx_sum
                        b1 = b * G
                        if m * a1 + b1 * m * (m - 1) * 0.5 > tau:
                            m = steps_until(pcs, ctx_sum, G, tau)
                    else:
                        ma = steps_until(pcs, ctx_sum, G, tau)
                        if ma < m:
                            m = ma
                if m > 1 and (ctx_sum + (m - 1) * G + n_dec) / bt + n_dec - shared_dec + alloc_pf + pinned > total_blocks:
                    # the pool may run out inside the run: stop before the first step that does not fit
                    sync(t, gstep, ctx_sum, G, n_dec, shared_dec, alloc_pf, pinned, top, n_left, nxt)
                    m = self._first_short_step(total_blocks - alloc_pf - pinned, m)
                if m == 1:
                    t += step_time(n_dec, ctx_sum)
                # m > 1 only where the clock gave pieces (pcs is not None above)
                elif len(pcs) == 1:  # type: ignore[arg-type]
                    _, a, b = pcs[0]  # type: ignore[index]
                    t += m * (a + b * ctx_sum) + b * G * m * (m - 1) * 0.5
                else:
                    t += time_of(pcs, ctx_sum, G, m)  # type: ignore[arg-type]
                gstep += m
                ctx_sum += m * G
            else:
                # nothing can run: the head does not fit an empty engine (cannot happen after rejection)
                raise AssertionError("simulator stalled with an empty engine")
            # ---- 5. completions at this step boundary ---------------------------------------------
            while heap and heap[0][0] <= gstep:
                fs, i, ep = heapq.heappop(heap)
                if ep != epoch[i]:
                    continue
                fin_t[i] = t
                s = slot_of[i]
                ctx_sum -= L0_of[i] + (gstep - S0_of[i]) * gain[i]
                G -= gain[i]
                n_dec -= 1
                shared_dec -= shared_of[i]
                w0[s], w2[s], w3[s] = -1.0, 0.0, 0.0  # a free slot: see _stop_decode
                heapq.heappush(free_slots, s)
                active[s] = False
                while top and not active[top - 1]:
                    top -= 1
                slot_of[i] = -1
                steps_done[i] = nsteps[i]
                del running[i]
                n_left -= 1
                if self.nxt_c < n:
                    self.t = t
                    self._on_done(i)
            if n_dec == 0:
                ctx_sum, G = 0.0, 0.0
        sync(t, gstep, ctx_sum, G, n_dec, shared_dec, alloc_pf, pinned, top, n_left, nxt)
        self.events = events

    def _join_decode(self, i: int, d: int) -> None:
        """Request ``i``, admitted with its prompt's ``d`` tokens of KV already computed elsewhere
        (a prefill replica), emits its first token now (it came with the KV) and decodes the rest."""
        self.first_t[i] = self.t
        self.shared_of[i] = 0
        left = self.nsteps[i] - self.steps_done[i]
        if left <= 0:
            self.fin_t[i] = self.t
            del self.running[i]
            self.n_left -= 1
            if self.nxt_c < self.n:
                self._on_done(i)
            return
        s = heapq.heappop(self.free_slots)
        self.active[s] = True
        if s >= self.top:
            self.top = s + 1
        self.slot_of[i] = s
        g, gstep = self.gain[i], self.gstep
        self.L0_of[i], self.S0_of[i] = float(d), gstep
        w0, w1, w2, w3, w4 = self.slot_w
        w0[s], w1[s], w2[s], w3[s], w4[s] = float(d), gstep, g, 0, gstep + left
        self.ctx_sum += d
        self.G += g
        self.n_dec += 1
        heapq.heappush(self.heap, (gstep + left, i, self.epoch[i]))

    def _sync(self, t, gstep, ctx_sum, G, n_dec, shared_dec, alloc_pf, pinned, top, n_left, nxt) -> None:
        """The loop's local state onto the replica, before a method that reads it."""
        self.t, self.gstep, self.ctx_sum, self.G, self.n_dec, self.shared_dec = t, gstep, ctx_sum, G, n_dec, shared_dec
        self.alloc_pf, self.pinned, self.top, self.n_left, self.nxt = alloc_pf, pinned, top, n_left, nxt

    def _reject_head(self) -> None:
        """Drop rejected requests from the head of the waiting queue (they are never served)."""
        waiting, rejected = self.waiting, self.rejected
        while waiting and rejected[waiting[0]]:
            i = waiting.popleft()
            self.n_left -= 1
            self._on_done(i)

    def _on_done(self, i: int) -> None:
        """Closed loop: the client that sent ``i`` sends the next request now. It arrives just
        after now (``nextafter``), as a timed arrival: the step that starts at this boundary is
        already scheduled without it, and it joins at the next boundary (an idle engine waits for
        it). A serving engine schedules its next step as soon as one ends, before the finished
        request's output has reached the client, let alone the client's next request come back
        (vLLM V1: ``EngineCoreProc.run_busy_loop`` reads its input queue, then runs the step; the
        outputs leave through the output queue to the API server process, the next request comes
        back through it into the input queue: vllm/v1/engine/core.py). Joining the step in flight
        let a client never wait for another client's prompt, and TTFT came out low."""
        if self.nxt_c < self.n:
            self.arr[self.nxt_c] = math.nextafter(self.t, math.inf)
            self.nxt_c += 1
            self.n_trace = self.nxt_c  # the requests sent so far arrive at their arr[i]

    # ---- blocks ------------------------------------------------------------------------------
    def dec_blocks(self, j: int) -> int:
        """Exact blocks the decoding sequences hold for the step ``j`` steps from now."""
        if not self.n_dec:
            return 0
        k = self.top
        c = self.sL0[:k] + (self.gstep + j - self.sS0[:k]) * self.sg[:k]
        return int(np.ceil((c + 1.0) / self.bt).sum() - self.ssh[:k].sum())

    def _used_bound(self) -> float:
        """Blocks in use, bounded above (sum of ceilings <= sum + count)."""
        return (self.ctx_sum + self.n_dec) / self.bt + self.n_dec - self.shared_dec + self.alloc_pf + self.pinned

    def _first_short_step(self, avail: int, m: int) -> int:
        """Steps that fit (1..m) before the decoding sequences' blocks exceed ``avail`` (step 0 is
        known to fit). With one token per step, a sequence with c cached tokens holds
        ceil((c + 1 + j) / bt) blocks at step j: floor((j + e) / bt) more than at step 0, where
        e = c mod bt. Over B sequences, after j = q bt + r steps that is q B + #{i : e_i >= bt - r}
        extra blocks, so the first step that does not fit follows from a histogram of e."""
        k, bt, sg = self.top, self.bt, self.sg
        act = sg[:k] > 0
        c = (self.sL0[:k] + (self.gstep - self.sS0[:k]) * sg[:k])[act]
        used0 = int(np.ceil((c + 1.0) / bt).sum() - self.ssh[:k][act].sum())
        free = avail - used0
        if not self.unit_gain:
            lo, hi = 0, m - 1
            if self.dec_blocks(hi) <= avail:
                return m
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self.dec_blocks(mid) > avail:
                    hi = mid
                else:
                    lo = mid
            return lo + 1
        nb = len(c)
        e = np.mod(c, bt).astype(np.int64)
        cnt = np.bincount(e, minlength=bt)
        suffix = np.cumsum(cnt[::-1])[::-1]             # suffix[x] = #{e_i >= x}
        q0 = free // nb
        rem = free - q0 * nb
        # smallest r in [1, bt] with #{e_i >= bt - r} > rem (r = bt: every sequence, nb > rem)
        r = 1
        while r < bt and suffix[bt - r] <= rem:
            r += 1
        j_short = q0 * bt + r                           # first step index whose blocks do not fit
        return min(m, j_short)

    # ---- decode slots ------------------------------------------------------------------------
    def _stop_decode(self, i: int, c: float) -> None:
        """Request ``i`` (``c`` tokens cached now) leaves the decoding set."""
        s = self.slot_of[i]
        self.ctx_sum -= c
        self.G -= self.gain[i]
        self.n_dec -= 1
        self.shared_dec -= self.shared_of[i]
        # a free slot holds no blocks: L0 = -1, gain 0, shared 0 (its stale start and finish steps
        # only ever meet a gain of 0: their products are zeros)
        w = self.slot_w
        w[0][s], w[2][s], w[3][s] = -1.0, 0.0, 0.0
        heapq.heappush(self.free_slots, s)
        active = self.active
        active[s] = False
        k = self.top
        while k and not active[k - 1]:
            k -= 1
        self.top = k
        self.slot_of[i] = -1

    # ---- 2. room for this step's decodes -------------------------------------------------------
    def _make_room(self) -> bool:
        """This step's decode blocks may not fit (their upper bound does not): preempt the newest
        running requests while they do not; True if any was preempted."""
        preempted = False
        used = self.dec_blocks(0) + self.alloc_pf + self.pinned
        while used > self.total_blocks and self.running:
            used -= self._preempt()
            preempted = True
        if not self.running and self.pinned:
            # the last request alone did not fit beside the pinned prefixes: an empty engine
            # drops the prefix cache (as at admission) and may admit at once
            self.pinned = 0
            self.cached_groups.clear()
            preempted = False
        if preempted:
            self.admission.on_preempted(self)
        return preempted

    def _preempt(self) -> int:
        """Preempt the most recently admitted running request; return the blocks it frees."""
        running = self.running
        v = next(reversed(running))
        del running[v]
        if self.slot_of[v] >= 0:
            done_now = self.gstep - self.S0_of[v]
            self.steps_done[v] += done_now
            c = self.L0_of[v] + done_now * self.gain[v]
            freed = math.ceil((c + 1.0) / self.bt) - self.shared_of[v]
            self._stop_decode(v, c)
            self.epoch[v] += 1
            if self.n_dec == 0:
                self.ctx_sum, self.G = 0.0, 0.0
        else:
            self.prefilling.remove(v)
            self.alloc_pf -= self.pf_alloc[v]
            freed = self.pf_alloc[v]
        self.waiting.appendleft(v)
        self.preemptions += 1
        return freed

    # ---- 3. prompt chunks for this step --------------------------------------------------------
    def _admit(self, chunks: list, ptoks: int, ppairs: float, pkv: float, budget: int) -> tuple:
        """Admit from the head of the waiting queue (FCFS) while the budget, the batch cap, the KV
        pool and the admission policy allow; each admitted prompt's first chunk joins ``chunks``.
        Returns the step's (prompt tokens, attention pairs, cached tokens read, budget left)."""
        waiting = self.waiting
        pf_done, pf_target = self.pf_done, self.pf_target
        running, cap, bt = self.running, self.cap, self.bt
        rejected, steps_done, gain = self.rejected, self.steps_done, self.gain
        inp, pre, grp = self.inp, self.pre, self.grp
        reserve, admission, kv_ready = self.reserve, self.admission, self.kv_ready
        limit = self.total_blocks - self.watermark_blocks
        used_ub = None
        res = 0.0   # blocks the admission policy holds back for outputs (running, then admitted now)
        while budget > 0 and waiting and len(running) < cap:
            i = waiting[0]
            if self.any_rejected and rejected[i]:
                self._reject_head()
                continue
            target = inp[i] + (int(round(steps_done[i] * gain[i])) if steps_done[i] else 0)
            cached = 0
            kv = kv_ready is not None and kv_ready[i]
            if kv:
                cached = target  # its prompt's KV came from a prefill replica: nothing to compute
            elif self.use_prefix and pre[i] > 0 and grp[i] in self.cached_groups:
                cached = min(pre[i], target - 1)
            shared = 0 if kv else cached // bt
            need = -(-target // bt) - shared
            if used_ub is None:
                used_ub = self._used_bound()
                if reserve:
                    res = admission.running_reserve(self)
            own = admission.own_reserve(self, i) if reserve else 0.0
            # an empty engine takes the head whatever its output (it fits: not rejected)
            extra = res + own if running else 0.0
            if used_ub + need + extra > limit:
                used = self.dec_blocks(0) + self.alloc_pf + self.pinned
                if used + need + extra > limit:
                    if not running and self.pinned:
                        self.pinned = 0  # an empty engine that cannot take the head: drop the prefix cache
                        self.cached_groups.clear()
                        used_ub = None
                        continue
                    break
                used_ub = used
            waiting.popleft()
            running[i] = None
            res += own
            if kv:
                kv_ready[i] = False  # type: ignore[index]  # kv: kv_ready is set; preempted, it recomputes here
                used_ub += need
                self._join_decode(i, target)
                continue
            pf_done[i], pf_target[i], self.pf_alloc[i] = cached, target, need
            self.shared_of[i] = shared
            self.alloc_pf += need
            used_ub += need
            self.prefilling.append(i)
            c = target - cached
            if c > budget:
                c = budget
            ptoks += c
            ppairs += c * cached + c * (c + 1) * 0.5
            pkv += cached
            chunks.append((i, c))
            budget -= c
        return ptoks, ppairs, pkv, budget

    # ---- 4. advancing time ---------------------------------------------------------------------
    def _next_finish(self) -> int:
        """The step at which the first decoding sequence finishes (stale heap entries dropped)."""
        heap, epoch = self.heap, self.epoch
        while heap[0][2] != epoch[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0][0]

    def _chunk_run_length(self, chunk: tuple) -> int:
        """Steps that repeat this one's shape, where one prompt (``chunk``: request, tokens) takes
        the whole budget beside a fixed decode set: until its last chunk, the next completion or
        the block bound."""
        i, c = chunk
        m = 1 + max(self.pf_target[i] - self.pf_done[i] - c - 1, 0) // c
        if self.n_dec:
            m = min(m, self._next_finish() - self.gstep)
            G = self.G
            if G > 0:
                room = ((self.total_blocks - self.n_dec + self.shared_dec - self.alloc_pf - self.pinned) * self.bt
                        - self.n_dec - self.ctx_sum)
                m = min(m, 1 + max(int(room // G), 0))
        return m

    def _chunk_run(self, chunk: tuple, m: int) -> None:
        """``m`` mixed steps of the same shape, summed in closed form: every term of the step is
        linear in the step index (the prompt's cached prefix and the decodes' contexts grow
        linearly), so the time is the sum of max(mem, comp) over a line plus the fixed terms."""
        i, c = chunk
        d0 = self.pf_done[i]
        k = m - 1
        n_dec, ctx_sum, G = self.n_dec, self.ctx_sum, self.G
        terms = self.step.step_terms
        t0, mem0, comp0 = terms(n_dec, ctx_sum, c, c * d0 + c * (c + 1) * 0.5, d0)[:3]
        _, mem1, comp1 = terms(n_dec, ctx_sum + k * G, c, c * (d0 + k * c) + c * (c + 1) * 0.5, d0 + k * c)[:3]
        j = _steps_over(m, k)
        a = j * (mem1 - mem0)
        a += mem0
        b = j * (comp1 - comp0)
        b += comp0
        np.maximum(a, b, out=a)
        self.t += float(np.sum(a)) + m * (t0 - max(mem0, comp0))
        self.gstep += m
        self.ctx_sum += m * G
        self.pf_done[i] = d0 + m * c
