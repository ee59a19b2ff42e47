"""The remembered draw behind ``Workload.requests``: the same requests as a fresh draw, whatever a
caller does to the arrays it got, and a bounded memory."""

from __future__ import annotations

import math

import numpy as np

from kvtune.costmodel import traffic
from kvtune.costmodel.traffic import SLO, LengthDist, RequestClass, Workload

FIELDS = ("arrival_s", "input_tokens", "output_tokens", "prefix_tokens", "prefix_group", "ttft_slo_s",
          "tpot_slo_s", "class_idx")


def _wl() -> Workload:
    return Workload(classes=(
        RequestClass("a", 0.7, LengthDist("lognormal", (800, 0.6), min_tokens=200), LengthDist("uniform", (20, 400)), prefix_tokens=100),
        RequestClass("b", 0.3, LengthDist("fixed", (3000,)), LengthDist("normal", (200, 50)))),
        rate_req_s=4.0, slo=SLO(500, 40))


def _same(r1, r2) -> bool:
    return all(np.array_equal(getattr(r1, f), getattr(r2, f)) and getattr(r1, f).dtype == getattr(r2, f).dtype
               for f in FIELDS) and r1.class_names == r2.class_names


def test_a_remembered_draw_is_the_fresh_one():
    wl = _wl()
    traffic._DRAWS.clear()
    fresh = [wl.requests(n, s, rate_req_s=r) for n in (0, 1, 500) for s in (0, 3) for r in (0.5, 7.0, math.inf)]
    assert traffic._DRAWS                                      # remembered now
    again = [wl.requests(n, s, rate_req_s=r) for n in (0, 1, 500) for s in (0, 3) for r in (0.5, 7.0, math.inf)]
    assert all(_same(a, b) for a, b in zip(fresh, again))


def test_the_rate_only_divides_the_arrival_times():
    wl = _wl()
    one, fast = wl.requests(400, 1, rate_req_s=1.0), wl.requests(400, 1, rate_req_s=8.0)
    assert np.array_equal(fast.arrival_s, one.arrival_s / 8.0)
    assert all(np.array_equal(getattr(one, f), getattr(fast, f)) for f in FIELDS if f != "arrival_s")
    assert not wl.requests(5, 1, rate_req_s=math.inf).arrival_s.any()


def test_changing_the_arrays_a_caller_got_does_not_change_the_next_draw():
    wl = _wl()
    r = wl.requests(300, 2, rate_req_s=2.0)
    keep = {f: getattr(r, f).copy() for f in FIELDS}
    for f in FIELDS:
        getattr(r, f)[:] = 0
    nxt = wl.requests(300, 2, rate_req_s=2.0)
    assert all(np.array_equal(getattr(nxt, f), keep[f]) for f in FIELDS)
    assert nxt.input_tokens.min() >= 200


def test_the_memo_is_bounded_oldest_first():
    wl = _wl()
    traffic._DRAWS.clear()
    for s in range(traffic.DRAW_MEMO + 5):
        wl.requests(10, s, rate_req_s=1.0)
    assert len(traffic._DRAWS) == traffic.DRAW_MEMO
    assert (wl, 10, 0) not in traffic._DRAWS and (wl, 10, traffic.DRAW_MEMO + 4) in traffic._DRAWS
