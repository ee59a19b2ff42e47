"""TensorRT-LLM in-flight batching: context (prefill) chunks ride in the generation step within
the token budget (``max_num_tokens``), as vLLM V1's mixed steps; kvtune admits a request on its
prompt's KV blocks, as for vLLM (its shipped calibration was fitted under these rules)."""

from __future__ import annotations

from .base import Engine
from .capabilities import CAPABILITIES
from .policies import MixedChunkedPrefill, PromptAdmission

TRTLLM = Engine(name="trtllm", display_name="TensorRT-LLM", version="1.0 (trtllm-serve)",
                scheduling=MixedChunkedPrefill(), admission=PromptAdmission(),
                fit_ttft_stage=True, staggered_clients=True,
                # disaggregated (trtllm-serve disaggregated): the context server's cache transceiver
                # sends the KV once the context phase is done and returns the first token, which the
                # generation server starts from (tensorrt_llm/disaggregated_params.py
                # first_gen_tokens)
                kv_sent_per_chunk=False, first_token_from_prefill=True,
                capabilities=CAPABILITIES["trtllm"])
