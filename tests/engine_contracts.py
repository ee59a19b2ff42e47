"""Launch lines checked against the engines' own argument definitions (tests/contracts/*.json,
made by bench/refresh_engine_contracts.py from the engines' published archives), without
installing any engine: every flag exists for that program, takes a value or not as the engine
defines it, the value has the engine's type and is one of its choices (literal sets), a JSON
value's keys are the config class's fields with their literal choices; plus the start-up checks
the engines run that kvtune can encode (vLLM's max-model-len against the KV pool).

Imported by the tests as ``from engine_contracts import ...`` (tests/ is on the path)."""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from pathlib import Path

CONTRACTS = Path(__file__).parent / "contracts"
FILES = {"vllm": "vllm-0.33.0.json", "sglang": "sglang-0.5.23.json", "vllm-router": "vllm-router-0.1.17.json",
         "sglang-router": "sglang-router-0.3.2.json", "llamacpp": "llamacpp-0c1e57098.json",
         "trtllm": "tensorrt-llm-1.0.0.json", "trtllm-disagg": "tensorrt-llm-1.0.0.json"}
# how many leading words name the program, and how many positionals follow it
PROGRAMS = {"vllm": ("vllm serve", 2, 1), "sglang": ("python -m sglang.launch_server", 3, 0),
            "vllm-router": ("vllm-router", 1, 0), "sglang-router": ("python -m sglang_router.launch_router", 3, 0),
            "llamacpp": ("llama-server", 1, 0), "trtllm": ("trtllm-serve", 1, 1),
            "trtllm-disagg": ("trtllm-serve disaggregated", 2, 0)}
# a value kvtune leaves for the user or the cluster to fill: <placeholder>, $(ENV_VAR)
_PLACEHOLDER = re.compile(r"^(<[^>]+>|\$\([A-Z_]+\))$")
VLLM_BLOCK_TOKENS = 16   # vLLM 0.33.0 CacheConfig.block_size on CUDA (platforms/cuda.py)


@lru_cache(maxsize=None)
def contract(engine: str) -> dict:
    return json.loads((CONTRACTS / FILES[engine]).read_text())


def _is_flag(tok: str) -> bool:
    return tok.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", tok)


def _type_ok(kind: str, v: str) -> bool:
    if _PLACEHOLDER.match(v):
        return True
    try:
        if kind == "int":
            int(v)
        elif kind == "float":
            float(v)
    except ValueError:
        return False
    return True


def _check_json(engine: str, flag: str, config: str, text: str, errors: list[str]) -> None:
    try:
        obj = json.loads(text)
    except ValueError as exc:
        errors.append(f"{flag}: not JSON ({exc})")
        return
    fields = contract(engine).get("configs", {}).get(config)
    if fields is None or not isinstance(obj, dict):
        return
    for k, v in obj.items():
        if k not in fields:
            errors.append(f"{flag}: {config} has no field {k!r}")
            continue
        f = fields[k]
        if f.get("type") == "literal" and v not in f["choices"] and not (v is None and f.get("nullable")):
            errors.append(f"{flag}: {config}.{k} = {v!r} is not one of {f['choices']}")
        elif f.get("type") == "int" and not (isinstance(v, int) and not isinstance(v, bool)):
            errors.append(f"{flag}: {config}.{k} = {v!r} is not an int")


def check_argv(engine: str, argv: list[str]) -> list[str]:
    """Everything in ``argv`` (the whole command, program words included) the engine's own
    definitions refuse; [] when it parses."""
    prog, words, positionals = PROGRAMS[engine]
    errors: list[str] = []
    if " ".join(argv[:words]) != prog:
        return [f"expected {prog!r}, got {' '.join(argv[:words])!r}"]
    flags = contract(engine)["programs"][prog]["flags"]
    rest = argv[words:]
    i = 0
    while i < len(rest) and not _is_flag(rest[i]):
        i += 1
    if i > positionals:
        errors.append(f"{i} positional argument(s) where {prog} takes {positionals}: {rest[:i]}")
    while i < len(rest):
        tok = rest[i]
        i += 1
        if not _is_flag(tok):
            errors.append(f"stray value {tok!r}")
            continue
        name, eq, inline = tok.partition("=")
        spec = flags.get(name)
        if spec is None:
            errors.append(f"{name}: no such option in {contract(engine)['name']} {contract(engine)['version']}")
            continue
        if spec["type"] in ("flag", "bool"):
            if eq:
                errors.append(f"{name} takes no value")
            continue
        nargs = spec.get("nargs")
        if eq:
            values = [inline]
        else:
            take = 1
            if nargs in ("+", "*") or (isinstance(nargs, int) and nargs > 1):
                take = 10**6 if nargs in ("+", "*") else int(nargs)
            values = []
            while i < len(rest) and len(values) < take and not _is_flag(rest[i]):
                values.append(rest[i])
                i += 1
            if nargs == "?":
                pass
            elif not values:
                errors.append(f"{name} needs a value")
                continue
        for v in values[:1] if spec["type"] == "json" else values:
            if spec["type"] == "json":
                _check_json(engine, name, spec.get("config", ""), v, errors)
            elif not _type_ok(spec["type"], v):
                errors.append(f"{name} {v!r}: not {spec['type']}")
            elif "choices" in spec and not _PLACEHOLDER.match(v):
                ok = {str(c) for c in spec["choices"] if c is not None}
                if v not in ok:
                    errors.append(f"{name} {v!r}: not one of {sorted(ok)}")
    return errors


def flag_value(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def vllm_startup_errors(argv: list[str], pool_tokens_per_gpu: int | None) -> list[str]:
    """vLLM 0.33.0's start-up check (v1/core/kv_cache_planning.py ``check_enough_kv_cache_memory``):
    one request of ``max_model_len`` needs ``cdiv(max_model_len, block_size)`` blocks
    (FullAttentionSpec.max_memory_usage_bytes) of a pool that has its null block taken out
    (``_pool_bytes_per_block``); else "To serve at least one request with the model's max seq len
    ... larger than the available KV cache memory". Without ``--max-model-len`` vLLM takes the
    model's own context, which kvtune's launch must not leave to chance: it is required."""
    v = flag_value(argv, "--max-model-len")
    if v is None:
        return ["no --max-model-len: vLLM would take the model's whole context and check the pool against it"]
    if pool_tokens_per_gpu is None:
        return []
    need_blocks = math.ceil(int(v) / VLLM_BLOCK_TOKENS)
    have_blocks = pool_tokens_per_gpu // VLLM_BLOCK_TOKENS - 1
    if need_blocks > have_blocks:
        return [f"--max-model-len {v} needs {need_blocks} KV blocks; the {pool_tokens_per_gpu}-token pool has "
                f"{have_blocks} after the null block: vLLM refuses to start"]
    return []


def _value_errors(path: str, f: dict, v) -> list[str]:
    """A YAML value against a config field's kind (pydantic: literal sets, int, float, bool, str)."""
    if v is None:
        return [] if f.get("nullable") else [f"{path}: null where the field is not Optional"]
    t = f.get("type")
    if t == "literal" and v not in f["choices"]:
        return [f"{path} = {v!r} is not one of {f['choices']}"]
    if t == "int" and not (isinstance(v, int) and not isinstance(v, bool)):
        return [f"{path} = {v!r} is not an int"]
    if t == "float" and not (isinstance(v, (int, float)) and not isinstance(v, bool)):
        return [f"{path} = {v!r} is not a number"]
    if t == "bool" and not isinstance(v, bool):
        return [f"{path} = {v!r} is not a bool"]
    if t == "str" and not isinstance(v, str):
        return [f"{path} = {v!r} is not a string"]
    return []


def check_trtllm_api(api, cls: str = "TorchLlmArgs", where: str = "", later: str | None = "TorchLlmArgs") -> list[str]:
    """An ``--extra_llm_api_options`` YAML (as loaded) against TensorRT-LLM 1.0.0's own pydantic
    classes: every key a field of ``cls`` (StrictBaseModel forbids others), nested configs
    recursively, ``speculative_config.decoding_type`` one of DecodingBaseConfig.from_dict's and
    the rest that class's fields, every value of the field's type or literal set. The contract's
    llm_args.py is a revision of the 1.0 line before the tag, so every key must also be a field
    of the same class in the later revision that brackets 1.0.0 (``bracket``; ``later`` is the
    class there): a key renamed or removed between them is refused."""
    c = contract("trtllm")
    if not isinstance(api, dict):
        return [f"{where or 'the YAML'}: not a mapping"]
    fields = c["configs"].get(cls)
    if fields is None:
        return [f"{where}: no contract for {cls}"]
    bracket = c.get("bracket", {})
    lfields = bracket.get("configs", {}).get(later) if later else None
    errors: list[str] = []
    for k, v in api.items():
        path = f"{where}{k}"
        if k not in fields:
            errors.append(f"{path}: {cls} has no field {k!r} in {c['name']} {c['version']}")
            continue
        if lfields is not None and k not in lfields:
            errors.append(f"{path}: {later} of the later revision bracketing {c['version']} has no field {k!r}")
        f = fields[k]
        lf = (lfields or {}).get(k, {})
        if cls == "TorchLlmArgs" and k == "speculative_config":
            if not isinstance(v, dict):
                errors.append(f"{path}: not a mapping")
                continue
            rest = dict(v)
            dt = rest.pop("decoding_type", None)
            target = c["decoding_types"].get(dt) if isinstance(dt, str) else None
            if target is None:
                errors.append(f"{path}.decoding_type {dt!r} is not one of {sorted(c['decoding_types'])}")
                continue
            ltarget = bracket.get("decoding_types", {}).get(dt) if bracket else None
            if bracket and ltarget is None:
                errors.append(f"{path}.decoding_type {dt!r}: not in the later revision bracketing {c['version']}")
            errors += check_trtllm_api(rest, target, f"{path}.", ltarget)
        elif f.get("type") == "object" and f.get("config") in c["configs"]:
            if v is None and f.get("nullable"):
                continue
            errors += check_trtllm_api(v, f["config"], f"{path}.", lf.get("config") if lfields is not None else None)
        else:
            errors += _value_errors(path, f, v)
    return errors


def trtllm_startup_errors(argv: list[str], api: dict, disaggregated: bool = False) -> list[str]:
    """TensorRT-LLM 1.0's start-up checks that kvtune's launch can trip (llm_args.py of the
    contract's revision): trtllm-serve builds ``build_config`` from its flags and the YAML's
    ``max_batch_size`` / ``max_num_tokens`` may not exceed it
    (``validate_build_config_with_runtime_params`` raises); ``validate_speculative_config``
    asserts ``max_draft_len > 0`` and a ``speculative_model_dir`` for Eagle and DraftTarget,
    ``max_matching_ngram_size > 0`` for NGram, ``num_nextn_predict_layers > 0`` for MTP; a
    disaggregated worker with no ``cache_transceiver_config.backend`` has its transceiver disabled
    ("please set 'cache_transceiver_config: backend:' in config file for disaggregated serving")."""
    errors: list[str] = []
    for key in ("max_batch_size", "max_num_tokens"):
        cli = flag_value(argv, f"--{key}")
        if cli is None:   # build_config then takes BuildConfig's default (builder.py, not in the contract)
            errors.append(f"no --{key}: the YAML's {key} would be held to a default kvtune has not read")
            continue
        if _PLACEHOLDER.match(cli):
            continue
        built = int(cli)
        if isinstance(api.get(key), int) and api[key] > built:
            errors.append(f"{key} {api[key]} in the YAML is above the build_config's {built} (--{key}): "
                          f"TensorRT-LLM refuses to start")
    sc = api.get("speculative_config")
    if isinstance(sc, dict):
        dt = sc.get("decoding_type")
        draft = sc.get("max_draft_len")
        if dt in ("Eagle", "DraftTarget", "NGram") and not (isinstance(draft, int) and draft > 0):
            errors.append(f"speculative_config: {dt} needs max_draft_len > 0")
        if dt in ("Eagle", "DraftTarget") and not sc.get("speculative_model_dir"):
            errors.append(f"speculative_config: {dt} needs speculative_model_dir")
        if dt == "NGram" and not (isinstance(sc.get("max_matching_ngram_size"), int)
                                  and sc["max_matching_ngram_size"] > 0):
            errors.append("speculative_config: NGram needs max_matching_ngram_size > 0")
        if dt == "MTP" and not (isinstance(sc.get("num_nextn_predict_layers", 1), int)
                                and sc.get("num_nextn_predict_layers", 1) > 0):
            errors.append("speculative_config: MTP needs num_nextn_predict_layers > 0")
    if disaggregated and not (api.get("cache_transceiver_config") or {}).get("backend"):
        errors.append("cache_transceiver_config.backend unset: the worker's KV transceiver is disabled")
    return errors
