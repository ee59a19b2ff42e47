"""The toy engine's pure policy (its ``costmodel/engines/<name>.py``): what the shared engine suite's
toy engine schedules, admits and can launch. With ``toy_home.py`` it is all an engine needs: the
suite (tests/engines/test_engine_suite.py) registers both and runs it through every engine's contract.

"toy-serve" is made up: a server of one GPU that runs one KV cache type (bf16), no speculation,
aggregated replicas only; the fake engine (tests/fake_engine.py, style "toy") serves its command line.
"""

from __future__ import annotations

from kvtune.costmodel.engines import Capabilities, Engine, MixedChunkedPrefill, PromptAdmission

_SRC = "tests/toy_policy.py (a made-up engine)"

CAPABILITIES = Capabilities(
    engine="toy", label="Toy Serve 1.0", version="1.0",
    kv_dtypes=("bf16",), spec_methods=(), weight_formats=("bf16", "fp16"),
    deployments=("aggregated",), max_gpus_per_replica=1, multi_node=False, loader="hf",
    sources={"kv_dtypes": _SRC, "spec_methods": _SRC, "weight_formats": _SRC},
    not_launched={"kv:fp8": "toy-serve keeps its cache in bf16 only",
                  "deployment:disaggregated": "toy-serve has no prefill/decode split",
                  "tensor_parallel": "toy-serve runs on one GPU",
                  "multi_node": "toy-serve runs on one machine"})

TOY = Engine(name="toy", display_name="Toy Serve", version="1.0", scheduling=MixedChunkedPrefill(),
             admission=PromptAdmission(), capabilities=CAPABILITIES)
