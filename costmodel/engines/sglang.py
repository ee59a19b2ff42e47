"""SGLang: by default a waiting prompt gets a prefill-only batch and the decoding sequences wait for
it (``enable_mixed_chunk`` off); admission (its ``PrefillAdder``) holds room for the request's
whole output and a decaying share of the running requests' remaining output, with the defaults of
SGLang 0.4 to 0.5.x (``costmodel.engines.policies``)."""

from __future__ import annotations

from .base import Engine
from .capabilities import CAPABILITIES
from .policies import OutputReserveAdmission, PrefillFirst

SGLANG = Engine(name="sglang", display_name="SGLang", version="0.4-0.5.x",
                scheduling=PrefillFirst(), admission=OutputReserveAdmission(),
                fit_ttft_joint=True, fit_pool_stage=True,
                # disaggregated (--disaggregation-mode): each finished chunk of a chunked prompt
                # goes to the decode server while the next one computes, the last with the first
                # output token (python/sglang/srt/disaggregation/prefill.py process_prefill_chunk
                # -> send_kv_chunk; "token_id is the first output token")
                kv_sent_per_chunk=True, first_token_from_prefill=True,
                capabilities=CAPABILITIES["sglang"])
