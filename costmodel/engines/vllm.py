"""vLLM V1: every step decodes every running sequence and fills the rest of
``max_num_batched_tokens`` with prompt chunks (running prompts first, then the waiting queue in
FCFS order); a request is admitted when the KV pool has blocks for its prompt; a step that had to
preempt admits nothing (the V1 scheduler, vllm/v1/core/sched/scheduler.py)."""

from __future__ import annotations

from .base import Engine
from .capabilities import CAPABILITIES
from .policies import MixedChunkedPrefill, PromptAdmission

VLLM = Engine(name="vllm", display_name="vLLM", version="V1 engine (0.8 and later)",
              scheduling=MixedChunkedPrefill(), admission=PromptAdmission(), staggered_clients=True,
              # disaggregated (NixlConnector, vLLM 0.8+): the decode replica pulls the prompt's KV
              # blocks after the prefill request finishes (nixl_connector.py
              # get_num_new_matched_tokens: "Remote prefill: get all prompt blocks from remote"),
              # then recomputes the last prompt token for its first output token
              # (vllm/v1/core/sched/scheduler.py _update_waiting_for_remote_kv:
              # "if num_computed_tokens == request.num_tokens: num_computed_tokens -= 1")
              kv_sent_per_chunk=False, first_token_from_prefill=False,
              capabilities=CAPABILITIES["vllm"])
