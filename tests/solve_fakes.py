"""Fakes for the one solve (``optimizer.solve``): a GPU type's aggregated answer given, the rest run.

``solve_kinds(spec, agg_fake, **options)`` runs ``optimizer.solve.search_types`` (every GPU type,
both kinds on each, the best chosen, not settled) with ``agg_fake(spec, **asked)`` answering each
type's aggregated kind; ``asked`` is what that type's solve was asked (``asked``)."""

from __future__ import annotations

import dataclasses
import functools
import math

from kvtune.optimizer.solve import Progress, SolveOptions, search_types, solve_type


def asked(options: SolveOptions, usd_cap: float) -> dict:
    """What a type's solve was asked: the options that differ from the defaults, and a finite price cap."""
    kw = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)
          if getattr(options, f.name) != f.default}
    return kw | ({"usd_cap": usd_cap} if math.isfinite(usd_cap) else {})


def solve_kinds(spec, agg_fake=None, usd_cap=None, **options):
    """Every GPU type of ``spec`` and both kinds on each; ``agg_fake(spec, **asked)`` answers the
    aggregated kind (None: the real search). ``usd_cap``: one type's solve under that price cap."""
    opts = SolveOptions(**options)
    one = solve_type if agg_fake is None else functools.partial(
        solve_type, solve_aggregated=lambda ctx, o, p, cap: agg_fake(ctx.spec, **asked(o, cap)))
    if usd_cap is not None:
        return one(spec, opts, Progress(), usd_cap)
    return search_types(spec, opts, Progress(), one)


def solve_types(spec, type_fake, **options):
    """Every GPU type of ``spec``, ``type_fake(spec, **asked)`` answering each whole type (both kinds),
    the best chosen (``optimizer.solve.search_types``)."""
    return search_types(spec, SolveOptions(**options), Progress(),
                        lambda s, o, p, cap: type_fake(s, **asked(o, cap)))
