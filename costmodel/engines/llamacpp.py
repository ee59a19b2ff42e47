"""llama.cpp's ``llama-server``: its parallel slots (``-np``) decode together and a waiting prompt
joins the same batch, up to ``-b`` tokens a step, as vLLM V1's mixed steps; a request is admitted
when a slot is free (kvtune: on the prompt's KV blocks, the slots' cache being one pool). Clients
that start together stay in lock-step on a CPU (``costmodel.closed_loop``: burst)."""

from __future__ import annotations

from .base import Engine
from .capabilities import CAPABILITIES
from .policies import MixedChunkedPrefill, PromptAdmission

LLAMACPP = Engine(name="llamacpp", display_name="llama.cpp llama-server", version="ggml-org/llama.cpp@0c1e57098",
                  scheduling=MixedChunkedPrefill(), admission=PromptAdmission(),
                  capabilities=CAPABILITIES["llamacpp"])
