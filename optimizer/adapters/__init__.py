"""Engine adapters: a serving engine for a config, as a running server the tune loop can load,
stopped whatever happens (``optimizer.tune``; DESIGN.md "The measured loop").

- ``LocalAdapter``: kvtune starts llama.cpp's ``llama-server``, ``vllm serve`` or ``python -m
  sglang.launch_server`` from its own launch settings (``optimizer.launch``), so the command that
  was measured is exactly the one kvtune prints.
- ``TemplateAdapter``: the user's own command with ``{batch_cap}``, ``{port}``, ... filled per config.
- ``UrlAdapter``: a server the user launched; only the configs it runs are measured.

Each start finds a free port, waits for health with a timeout, reads the server back and checks
it against the plan (slots, KV pool, chunk budget, threads, model), and stops the engine's whole
process group on leaving (errors, Ctrl-C, a crash): ``process.EngineProcess``.
"""

from __future__ import annotations

from .base import Adapter, RunningEngine
from .engines import EnginePlan, EngineReport, kinds, model_matches
from .errors import EngineCrashed, EngineError, EngineMismatch, EngineStartError, Interrupted
from .local import TEMPLATE_FIELDS, LocalAdapter, TemplateAdapter
from .process import EngineProcess, free_port, port_in_use
from .url import UrlAdapter

__all__ = ["Adapter", "RunningEngine", "LocalAdapter", "TemplateAdapter", "UrlAdapter", "EnginePlan",
           "EngineReport", "kinds", "TEMPLATE_FIELDS", "EngineError", "EngineStartError", "EngineCrashed",
           "EngineMismatch", "Interrupted", "EngineProcess", "free_port", "port_in_use", "model_matches"]
