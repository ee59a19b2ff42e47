"""Scheduling and admission policies: the two things the serving engines kvtune models do
differently, as the replica (``costmodel.replica``) asks them.

Scheduling decides what one engine step carries:

- ``MixedChunkedPrefill`` (vLLM V1, TensorRT-LLM in-flight batching, SGLang with
  ``--enable-mixed-chunk``): every decoding sequence decodes and prompt chunks fill the rest of the
  token budget, ``chunk_tokens - decodes x verify width``;
- ``PrefillFirst`` (SGLang's default): while a prompt waits, a prefill-only batch of up to
  ``chunk_tokens`` runs and the decoding sequences wait for it (no decode that step).

Admission decides whether the head of the waiting queue may start (beside the KV blocks its prompt
needs, which every engine checks):

- ``PromptAdmission`` (vLLM V1, TensorRT-LLM): nothing more;
- ``OutputReserveAdmission`` (SGLang's PrefillAdder): the pool must also hold the request's whole
  output and ``new_token_ratio`` x the remaining output of every running request (each clipped);
  the ratio decays while the engine decodes, resets when it idles and rises after a retraction.

A policy holds no per-run state of its own: what changes during a run (SGLang's ratio) lives on
the replica, and the policy's methods read and set it there.
"""

from __future__ import annotations


import numpy as np

__all__ = ["Scheduling", "MixedChunkedPrefill", "PrefillFirst", "Admission", "PromptAdmission",
           "OutputReserveAdmission", "RESERVE_RATIO_INIT", "RESERVE_RATIO_MIN", "RESERVE_RATIO_DECAY_PER_STEP",
           "RESERVE_CLIP_TOKENS", "RESERVE_RETRACT_STEPS"]

# SGLang's output reservation at admission; the defaults of SGLang's environ / global_config
# (SGLANG_INIT_NEW_TOKEN_RATIO, SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS,
# SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION, SGLANG_RETRACT_DECODE_STEPS), unchanged from 0.4 to 0.5.x
RESERVE_RATIO_INIT = 0.7
RESERVE_RATIO_MIN = 0.7 * 0.14
RESERVE_RATIO_DECAY_PER_STEP = (RESERVE_RATIO_INIT - RESERVE_RATIO_MIN) / 600
RESERVE_CLIP_TOKENS = 4096
RESERVE_RETRACT_STEPS = 20


class Scheduling:
    """What one step carries. Subclasses set the attributes below."""

    name = ""
    # decoding sequences decode in a step that carries prompt chunks (False: the step is prefill only)
    decodes_with_prefill = True
    # a run of identical prompt chunks beside a fixed decode set may be summed in closed form
    chunk_runs_ok = True
    # the decoding sequences' tokens count against the step's token budget
    budget_counts_decodes = True

    def prefill_budget(self, chunk_tokens: int, n_decode: int, verify_width: int) -> int:
        """Prompt tokens the next step may carry (the replica computes the same inline)."""
        return chunk_tokens - (n_decode * verify_width if self.budget_counts_decodes else 0)


class MixedChunkedPrefill(Scheduling):
    name = "mixed"
    decodes_with_prefill = True
    chunk_runs_ok = True
    budget_counts_decodes = True


class PrefillFirst(Scheduling):
    name = "prefill_first"
    decodes_with_prefill = False
    chunk_runs_ok = False
    budget_counts_decodes = False


class Admission:
    """Room the pool must hold beyond the head's prompt blocks, in blocks."""

    name = ""
    # the room held back changes from step to step (a decode run must stop each step while
    # requests wait and the batch has room)
    varies_per_step = False

    def running_reserve(self, r) -> float:
        """Blocks held back for the running requests of replica ``r``."""
        return 0.0

    def own_reserve(self, r, i: int) -> float:
        """Blocks held back for request ``i``'s own output, were it admitted."""
        return 0.0

    def on_idle(self, r) -> None:
        """The engine has nothing to run."""

    def on_preempted(self, r) -> None:
        """A step had to preempt (retract) running requests."""


class PromptAdmission(Admission):
    name = "prompt"


class OutputReserveAdmission(Admission):
    name = "prompt_and_output"
    varies_per_step = True

    def running_reserve(self, r) -> float:
        """The decaying new_token_ratio x the running requests' remaining tokens, each clipped."""
        ratio = max(r.nt_r0 - RESERVE_RATIO_DECAY_PER_STEP * (r.gstep - r.nt_s0), RESERVE_RATIO_MIN)
        tok = 0.0
        if r.n_dec:
            k = r.top
            tok = float(np.minimum((r.sF[:k] - r.gstep) * r.sg[:k], RESERVE_CLIP_TOKENS).sum())
        nsteps, steps_done, gain = r.nsteps, r.steps_done, r.gain
        for i in r.prefilling:
            tok += min((nsteps[i] - steps_done[i]) * gain[i], RESERVE_CLIP_TOKENS)
        return ratio * tok / r.bt

    def own_reserve(self, r, i: int) -> float:
        return min((r.nsteps[i] - r.steps_done[i]) * r.gain[i] + 1, RESERVE_CLIP_TOKENS) / r.bt

    def on_idle(self, r) -> None:
        r.nt_r0, r.nt_s0 = RESERVE_RATIO_INIT, r.gstep  # SGLang resets new_token_ratio when idle

    def on_preempted(self, r) -> None:
        """SGLang's new_token_ratio after a retraction: (tokens decoded + 20 per request) over the
        running requests' whole outputs, at most 1."""
        done_tok, total_tok = 0.0, 0.0
        gstep, out, gain = r.gstep, r.out, r.gain
        for i in r.running:
            s = r.slot_of[i]
            left = (r.sF[s] - gstep) * gain[i] if s >= 0 else (r.nsteps[i] - r.steps_done[i]) * gain[i]
            done_tok += max(out[i] - 1 - left, 0.0)
            total_tok += out[i]
        if total_tok <= 0:
            ratio = RESERVE_RATIO_INIT
        else:
            ratio = min(1.0, (done_tok + RESERVE_RETRACT_STEPS * len(r.running)) / total_tok)
        r.nt_r0, r.nt_s0 = ratio, gstep


