"""``--plan FILE`` of ``kvtune solve`` and ``kvtune tune``: the request plan the pick was judged on,
written whole (``optimizer.output.write_atomic``) or to stdout for ``-``, with the ``aiperf``
command that replays it (``optimizer.plan``)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import click

from kvtune import __version__
from kvtune.costmodel.errors import KvtuneError
from kvtune.optimizer.output import STDOUT, check_output_path, write_atomic

__all__ = ["plan_option", "check_plan_dest", "write_plan", "plan_lines"]

HELP = ("Write the requests the pick was judged on (arrival times, input/output lengths, shared-prefix blocks) to "
        "FILE as Mooncake trace JSONL, which AIPerf replays (--custom-dataset-type mooncake_trace --fixed-schedule; "
        "the command is printed); '-': stdout, and the human text goes to stderr. Import AIPerf's "
        "profile_export.jsonl back with kvtune profile import ... --plan FILE.")


def plan_option(help: str = HELP):
    return click.option("--plan", "plan_path", default=None, metavar="FILE", help=help)


def check_plan_dest(path: str | None) -> None:
    """Before the work: a --plan file can be written (stdout always can)."""
    if path is not None and path != STDOUT:
        check_output_path(path, "--plan")


def _tokenizer(model: str) -> str | None:
    from kvtune.costmodel.models import get_model
    try:
        return get_model(model).hf_id or None
    except KvtuneError:
        return None


def write_plan(path: str, made: tuple[Any, Mapping, Mapping], model: str, engine: str,
               launch_argv: Sequence[str] | None):
    """Write ``made`` (``optimizer.plan.solve_plan``/``tune_plan``) to ``path`` and return its
    ``PlanFile``: the aiperf command aims at the launch's port on localhost and the model it serves."""
    from kvtune.optimizer.plan import aiperf_argv, endpoint_of, plan_file, plan_text

    plan, pick, predicted = made
    text = plan_text(plan, pick, predicted, __version__)
    url, served = endpoint_of(engine, launch_argv)
    tok = _tokenizer(model)
    argv = aiperf_argv("plan.jsonl" if path == STDOUT else path, served or tok or model, url, text.block_tokens,
                       tokenizer=tok)
    if path == STDOUT:
        click.echo(text.text, nl=False)
    else:
        write_atomic(path, text.text)
    return plan_file(path, plan, text, argv)


def plan_lines(pf, replicas: int | None = None) -> list[str]:
    """What is printed (on stderr) about a written plan: what it holds and how to replay and import it."""
    where = "stdout (save it as plan.jsonl)" if pf.path == STDOUT else pf.path
    share = f"; the pick's {replicas} replicas split the traffic, so send it to one of them" \
        if replicas and replicas > 1 else ""
    shared = "every shared prefix in whole blocks" if not pf.prefix_tokens_unshared else \
        f"{pf.prefix_tokens_unshared:,} prefix tokens not in whole blocks are not shared by the replay"
    export = next((pf.argv[i + 1] for i in range(len(pf.argv) - 1) if pf.argv[i] == "--artifact-dir"), "artifacts")
    name = "plan.jsonl" if pf.path == STDOUT else pf.path
    return [f"plan: {pf.requests:,} requests ({pf.warmup} warm-up) at {pf.rate_req_s:.4g} req/s, seed {pf.seed}, "
            f"blocks of {pf.block_tokens} tokens ({shared}) written to {where}{share}; replay it with AIPerf:",
            f"  {pf.command}",
            f"  then: kvtune profile import {export}/profile_export.jsonl --plan {name} -o measured.csv"]
