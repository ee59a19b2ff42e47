"""The toy engine's home (its ``optimizer/launch/<name>.py``): version, flags, launch line and the
adapter ``kvtune tune`` starts it with; its policy is ``toy_policy.py``. The fake engine
(tests/fake_engine.py, style "toy") runs this command line and answers ``/toy/config``.
"""

from __future__ import annotations

from kvtune.optimizer.launch.pick import LaunchPick, Unsupported
from kvtune.optimizer.launch.serving import (EngineHome, EngineKind, EnginePlan, EngineReport, ServeLine,
                                             served_models, set_flag, whole)
from kvtune.optimizer.launch.versions import EngineVersion
from kvtune.optimizer.server_http import get_json

PORT = 8000
VERSION = EngineVersion("toy", "Toy Serve", "1.0", "tests/toy_home.py (a made-up engine)", "example.org/toy-serve:1.0")
FLAGS = {"--model": "toy-serve --help", "--max-seqs": "toy-serve --help (sequences at once)",
         "--step-tokens": "toy-serve --help (tokens a step)", "--kv-tokens": "toy-serve --help (KV pool tokens)",
         "--host": "toy-serve --help", "--port": "toy-serve --help"}


def toy_argv(p: LaunchPick) -> tuple[list[str], list[str]]:
    p.require_launchable("toy")   # its capabilities (toy_policy.CAPABILITIES): KV dtype, weights, speculation
    if p.gpus_per_replica > 1:
        raise Unsupported(f"TP {p.tp} x PP {p.pp}: toy-serve runs on one GPU")
    if p.memory is not None:
        pool = p.memory.kv_pool_tokens
    elif p.max_request_tokens:
        pool = p.batch_cap * int(p.max_request_tokens)
    else:
        raise Unsupported("no memory plan and no request length to size --kv-tokens from")
    argv = ["toy-serve", "--model", p.model, "--max-seqs", str(p.batch_cap), "--step-tokens", str(p.chunk_tokens),
            "--kv-tokens", str(pool), "--host", "0.0.0.0", "--port", str(PORT)]
    return argv, [f"KV pool: --kv-tokens {pool}"]


class Toy(EngineKind):
    name, label, default_binary = "toy", "Toy Serve", "toy-serve"
    probe = ("/toy/config", "max_seqs")

    def plan(self, pick, *, binary, model, host, port, threads):
        argv, notes = toy_argv(pick)
        argv = [binary] + argv[1:]
        if model:
            argv = set_flag(argv, "--model", model)
        argv = set_flag(set_flag(argv, "--host", host), "--port", str(port))
        return EnginePlan(self.name, tuple(argv), pick.batch_cap, pick.chunk_tokens,
                          int(argv[argv.index("--kv-tokens") + 1]), None, argv[argv.index("--model") + 1], tuple(notes))

    def read_back(self, root, log_text="", timeout_s=5.0):
        st, d = get_json(root, "/toy/config", timeout_s)
        d = d if st == 200 and isinstance(d, dict) else {}
        models = served_models(root, timeout_s)
        return EngineReport(engine=self.name, version=str(d.get("version", "")), served_model=models[0] if models else "",
                            slots=whole(d.get("max_seqs")), pool_tokens=whole(d.get("kv_tokens")),
                            chunk_tokens=whole(d.get("step_tokens")))


def serve_line(p: LaunchPick, node_rank=None, addr=None, nnodes=None, config_dir=None) -> ServeLine:
    return ServeLine(*toy_argv(p))


HOME = EngineHome("toy", VERSION, FLAGS, serve_line, adapter=Toy())
