"""Reading recorded traces (optimizer.traces): format detection, parsing, prefixes, errors."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from kvtune.costmodel.errors import InputError
from kvtune.costmodel.traffic import Workload
from kvtune.optimizer.traces import detect_format, read_trace

SAMPLES = Path(__file__).parent.parent.parent / "examples" / "traces"
DATA = Path(__file__).parent.parent / "data"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ---- formats -------------------------------------------------------------------------------------

def test_azure_hand_rows_seven_fraction_digits(tmp_path):
    p = _write(tmp_path, "az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                   "2023-11-16 18:15:46.6805900,374,44\n"
                                   "2023-11-16 18:15:50.9951456,396,109\n"
                                   "2023-11-16 18:16:00.0000001,879,12\n")
    t = read_trace(p)
    assert detect_format(p) == "azure"
    assert t.arrival_s.tolist() == pytest.approx([0.0, 4.3145556, 13.3194101], abs=1e-9)
    assert t.input_tokens.tolist() == [374, 396, 879] and t.output_tokens.tolist() == [44, 109, 12]
    assert (t.prefix_tokens == 0).all() and (t.prefix_group == -1).all()
    assert "Azure CSV" in t.source and "3 requests" in t.source


def test_azure_across_midnight_and_timezone(tmp_path):
    p = _write(tmp_path, "az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                   "2024-05-10 23:59:59.5+00:00,10,1\n"
                                   "2024-05-11 00:00:00.25+00:00,10,1\n"
                                   "2024-05-11 02:00:01+02:00,10,1\n")
    assert read_trace(p).arrival_s.tolist() == pytest.approx([0.0, 0.75, 1.5])


def test_burstgpt_skips_and_counts_failures(tmp_path):
    p = _write(tmp_path, "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                                  "5.0,ChatGPT,472,18,490,Conversation log\n"
                                  "7.0,ChatGPT,1087,0,1087,Conversation log\n"
                                  "8.5,GPT-4,417,276,693,API log\n"
                                  "9.0,GPT-4,0,20,20,API log\n")
    t = read_trace(p)
    assert detect_format(p) == "burstgpt"
    assert t.arrival_s.tolist() == [0.0, 3.5] and t.input_tokens.tolist() == [472, 417]
    assert "skipped 1 failed (0 output tokens), 1 with an empty prompt" in t.source


def test_mooncake_prefix_detection(tmp_path):
    rows = [
        {"timestamp": 1000, "input_length": 1500, "output_length": 10, "hash_ids": [1, 2, 3]},
        {"timestamp": 1500, "input_length": 1200, "output_length": 10, "hash_ids": [1, 2, 9]},  # shares [1, 2]
        {"timestamp": 2000, "input_length": 2000, "output_length": 10, "hash_ids": [1, 2, 3, 4]},  # shares [1,2,3]
        {"timestamp": 2600, "input_length": 700, "output_length": 10, "hash_ids": [2, 3]},  # 2 never led: none
        {"timestamp": 3000, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]},  # [1, 2], capped
        {"timestamp": 3100, "input_length": 100, "output_length": 10, "hash_ids": [1]},  # [1]: 512 capped to 100
    ]
    p = _write(tmp_path, "m.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    t = read_trace(p)
    assert detect_format(p) == "mooncake"
    assert t.arrival_s.tolist() == pytest.approx([0, 0.5, 1.0, 1.6, 2.0, 2.1])
    assert t.prefix_tokens.tolist() == [0, 1024, 1536, 0, 600, 100]
    g = t.prefix_group.tolist()
    assert g[0] == -1 and g[3] == -1
    assert g[1] == g[4] != g[2] and g[5] not in (g[1], g[2]) and min(g[1], g[2], g[5]) == 0


def test_kvtune_csv_with_prefix_columns(tmp_path):
    p = _write(tmp_path, "k.csv", "arrival_s,input_tokens,output_tokens,prefix_tokens,prefix_group\n"
                                  "10.0,100,5,50,3\n12.5,80,7,0,-1\n")
    t = read_trace(p)
    assert t.arrival_s.tolist() == [0.0, 2.5] and t.prefix_tokens.tolist() == [50, 0]
    assert t.prefix_group.tolist() == [3, -1]


def test_unsorted_rows_are_sorted_and_start_at_zero(tmp_path):
    p = _write(tmp_path, "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                                  "20,ChatGPT,3,3,6,API log\n10,ChatGPT,1,1,2,API log\n15,ChatGPT,2,2,4,API log\n")
    t = read_trace(p)
    assert t.arrival_s.tolist() == [0.0, 5.0, 10.0] and t.input_tokens.tolist() == [1, 2, 3]


# ---- the shipped samples ---------------------------------------------------------------------------

@pytest.mark.parametrize("name, fmt, rows", [("azure_conv_sample.csv", "azure", 300),
                                             ("mooncake_sample.jsonl", "mooncake", 300),
                                             ("burstgpt_sample.csv", "burstgpt", 284)])
def test_samples_parse(name, fmt, rows):
    t = read_trace(SAMPLES / name)
    assert detect_format(SAMPLES / name) == fmt and len(t) == rows
    assert t.arrival_s[0] == 0 and (np.diff(t.arrival_s) >= 0).all() and t.input_tokens.min() >= 1
    r = Workload(trace=t).requests(1000, seed=0, rate_req_s=10.0)
    assert len(r) == 1000 and (len(r) - 1) / r.arrival_s[-1] == pytest.approx(10.0)


def test_sample_shapes():
    bg = read_trace(SAMPLES / "burstgpt_sample.csv")
    assert "skipped 16 failed" in bg.source  # 300 rows written, 16 logged with 0 response tokens
    mc = read_trace(SAMPLES / "mooncake_sample.jsonl")
    assert (mc.prefix_tokens > 0).mean() > 0.5 and mc.prefix_tokens.mean() > 0.3 * mc.input_tokens.mean()
    az = read_trace(SAMPLES / "azure_conv_sample.csv")
    assert 800 < np.median(az.input_tokens) < 1300 and az.native_rate_req_s == pytest.approx(5.4, rel=0.2)


def test_samples_match_their_generator(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("make_samples", SAMPLES / "make_samples.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "HERE", tmp_path)
    rng = np.random.default_rng(0)
    mod.azure(rng)
    mod.mooncake(rng)
    mod.burstgpt(rng)
    for name in ("azure_conv_sample.csv", "mooncake_sample.jsonl", "burstgpt_sample.csv"):
        assert (tmp_path / name).read_bytes() == (SAMPLES / name).read_bytes(), name


# ---- errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, text, expected", [
    ("x.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,10,1\n"
              "2023-11-16 18:15:47.1,abc,1\n",
     "x.csv: line 3: column ContextTokens = 'abc' is not a whole number"),
    ("x.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,10,1\n2023-13-40 00:00:00,10,1\n",
     "x.csv: line 3: column TIMESTAMP = '2023-13-40 00:00:00' is not a valid date"),
    ("x.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,1\n",
     "x.csv: line 2: column TIMESTAMP = 'yesterday' is not a datetime"),
    ("x.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,10\n",
     "x.csv: line 2: has 2 columns, expected 3"),
    ("x.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,10,-4\n",
     "x.csv: line 2: column GeneratedTokens = '-4' is negative"),
    ("x.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\nsoon,GPT-4,1,1,2,API log\n",
     "x.csv: line 2: column Timestamp = 'soon' is not a number of seconds"),
    ("x.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,GPT-4,1.5,1,2,API log\n",
     "x.csv: line 2: column Request tokens = '1.5' is not a whole number"),
    ("x.jsonl", '{"timestamp": 1, "input_length": 5, "output_length": 1}\n{"timestamp": 2, "input_length": 5\n',
     "x.jsonl: line 2: not valid JSON"),
    ("x.jsonl", '{"timestamp": 1, "input_length": 5}\n', "x.jsonl: line 1: missing key 'output_length'"),
    ("x.jsonl", '{"timestamp": 1, "input_length": "many", "output_length": 1}\n',
     "x.jsonl: line 1: column input_length = 'many' is not a whole number"),
    ("x.csv", "time,prompt,completion\n1,2,3\n", "x.csv: line 1: unrecognised trace header 'time,prompt,completion'"),
    ("x.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", "x.csv: no usable requests in the trace"),
    ("x.csv", "\n\n", "x.csv: empty trace file"),
    ("x.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,GPT-4,10,0,10,API log\n",
     "x.csv: no usable requests in the trace (skipped 1 failed (0 output tokens))"),
])
def test_broken_traces_give_one_line(tmp_path, monkeypatch, name, text, expected):
    monkeypatch.chdir(tmp_path)
    Path(name).write_text(text)
    with pytest.raises(InputError) as exc:
        read_trace(name)
    assert "\n" not in str(exc.value)
    assert str(exc.value).startswith(expected), str(exc.value)


def test_missing_trace_file(tmp_path):
    with pytest.raises(InputError, match="no such trace file"):
        read_trace(tmp_path / "nope.csv")
