"""``ampkit train``: train a built-in or user task with the AMP engine."""

from __future__ import annotations

import os
import signal
import sys

from ampkit.cli.common import (ProgressView, add_device_arg, add_fp8_recipe_arg, add_fp32_modules_arg, add_weights_arg,
                               add_precision_arg, console, print_json)

EXAMPLES = """examples:
  ampkit train --task digits                               # auto precision, default steps
  ampkit train --task digits --precision fp16 --steps 300 --out runs/d --ckpt-every 50
  ampkit train --task digits --out runs/d --resume --steps 600   # continue the run to step 600
  ampkit train --task charlm --task-arg d_model=256 --task-arg n_layers=4
  ampkit train --task mytask.py:make_task --precision bf16 # your own model, data and loss
  ampkit train --task charlm --nproc 2 --strategy fsdp --precision bf16 --out runs/c --ckpt-every 50
  torchrun --nproc-per-node 8 -m ampkit train --task charlm --strategy ddp   # torchrun yourself (multi-node too)
  ampkit train --task charlm --nproc 2 --out runs/c --stop-signal SIGUSR1   # SLURM's warning signal saves too
  ampkit train --task charlm --out runs/c --resume --steps 600   # newest checkpoint, .pt or .dcp, any world size
  ampkit train --task digits --precision fp16 --init-scale 1024 --callback watch.py:make
"""


def register(sub, formatter_class):
    p = sub.add_parser("train", help="train a task with mixed precision (checkpoints, resume, metrics)",
                       description="Train with the AMP engine: FP16 loss scaling only where needed, unscale before "
                                   "clipping, non-finite steps skipped on the device, atomic checkpoints with the "
                                   "scaler, exact resume. Metrics go to DIR/metrics.jsonl.",
                       epilog=EXAMPLES, formatter_class=formatter_class)
    add_task_args(p)
    add_precision_arg(p)
    add_device_arg(p)
    p.add_argument("--steps", type=int, default=None, help="total optimizer steps of the run (default: the task's)")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the task (initial weights, data order) and torch's generators: same seed, same run")
    p.add_argument("--out", default=None, metavar="DIR", help="metrics.jsonl and checkpoints/ go here")
    p.add_argument("--ckpt-every", type=int, default=None, metavar="K", help="checkpoint every K steps")
    p.add_argument("--keep", type=int, default=3, help="checkpoints to keep")
    p.add_argument("--log-every", type=int, default=10, metavar="L", help="log metrics every L steps")
    p.add_argument("--resume", action="store_true", help="continue from the latest good checkpoint in --out")
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="clip the gradient norm (0: no clipping)")
    p.add_argument("--accumulation-steps", type=int, default=1, metavar="A",
                   help="backward passes per optimizer step (gradient accumulation): A batches make one step")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the task's)")
    p.add_argument("--tf32", action="store_true", default=None, help="allow TF32 for FP32 matmuls")
    p.add_argument("--no-fused", action="store_true", help="use the foreach AdamW instead of the fused one")
    add_fp8_recipe_arg(p, "with --precision fp8")
    p.add_argument("--no-graph", action="store_true",
                   help="eager steps: do not capture the whole step as one device graph (captured by default "
                        "where the device, the model and the run allow it; a note says why not otherwise)")
    p.add_argument("--tensorboard", action="store_true", help="also log to DIR/tensorboard (needs tensorboard)")
    p.add_argument("--init-scale", type=float, default=None, metavar="X",
                   help="FP16: the loss scaler's initial scale (default 65536; `ampkit diagnose --fp16-range` "
                        "recommends one)")
    add_fp32_modules_arg(p)
    add_weights_arg(p)
    p.add_argument("--callback", action="append", default=[], metavar="FILE.py:factory",
                   help="call factory() for an ampkit.Callback run before/after each step, repeatable "
                        "(module:factory works too)")
    p.add_argument("--stop-signal", default=None, metavar="SIG",
                   help="also stop gracefully on SIG (e.g. SIGUSR1, a scheduler's warning), as on SIGTERM/SIGINT: "
                        "finish the step, save a checkpoint, exit 128+SIG")
    p.add_argument("--stop-check-every", type=int, default=10, metavar="N",
                   help="with several processes: the ranks agree on a stop every N steps (one small all_reduce "
                        "and host read), so a stop takes effect within N steps")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of a summary")
    dist = p.add_argument_group("more than one device (torchrun)")
    dist.add_argument("--strategy", choices=("ddp", "fsdp"), default=None,
                      help="ddp: replicate the model; fsdp: shard it (FSDP2). Default under torchrun: ddp")
    dist.add_argument("--nproc", type=int, default=None, metavar="N",
                      help="start N processes on this node (execs torchrun --standalone --nproc-per-node N)")
    dist.add_argument("--max-restarts", type=int, default=None, metavar="R",
                      help="with --nproc: restart the job up to R times after a failure, resuming from the last "
                           "checkpoint (not given: no restarts)")
    p.set_defaults(func=run, _parser=p)
    return p


def add_task_args(p) -> None:
    p.add_argument("--task", default="digits", metavar="T",
                   help="built-in task (digits, charlm, llama) or FILE.py:factory / module:factory")
    p.add_argument("--task-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="option for the task factory, repeatable (e.g. n_layers=4)")


_LAUNCH_ONLY = {"nproc", "max_restarts"}


def _train_argv(parser, args) -> list[str]:
    """The command line that reproduces ``args``, less the launch-only options (for torchrun to start)."""
    argv: list[str] = []
    for action in parser._actions:
        if not action.option_strings or action.dest in _LAUNCH_ONLY or action.dest == "help":
            continue
        value = getattr(args, action.dest, None)
        flag = action.option_strings[-1] if action.option_strings[-1].startswith("--") else action.option_strings[0]
        if action.nargs == 0:  # store_true
            if value:
                argv.append(flag)
        elif isinstance(value, list):
            for item in value:
                argv += [flag, str(item)]
        elif value is not None and value != action.default:
            argv += [flag, str(value)]
    return argv


def _launch(args) -> int:
    """``--nproc N``: this process runs torchrun, which starts N copies of the same command (less --nproc).
    A stop signal is forwarded to them; the exit code is theirs (128 + the signal's number)."""
    from ampkit.distributed import launched
    from ampkit.distributed.launch import run_torchrun, torchrun_args
    from ampkit.errors import UsageError
    from ampkit.training.stop import parse_signal

    if launched():
        raise UsageError("--nproc starts torchrun, and this process already runs under torchrun: drop --nproc")
    stop = parse_signal(args.stop_signal).name if args.stop_signal else None
    cmd = torchrun_args(args.nproc, _train_argv(args._parser, args), max_restarts=args.max_restarts or 0,
                        stop_signal=stop)
    sys.stdout.flush()
    sys.stderr.flush()
    return run_torchrun(cmd)


def run(args) -> int:
    from ampkit.errors import UsageError
    from ampkit.tasks import parse_task_args
    from ampkit.training.trainer import TrainConfig, train

    if args.max_restarts is not None and args.nproc is None:
        raise UsageError("--max-restarts goes with --nproc N (under your own torchrun, pass --max-restarts to "
                         "torchrun)")
    main_rank = os.environ.get("RANK", "0") == "0"  # under torchrun only rank 0 prints
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        from ampkit.children import tie_to_parent

        tie_to_parent()  # a rank dies with its torchrun agent, even a SIGKILLed one (it forwards other signals)
    config = TrainConfig(
        task=args.task, task_options=parse_task_args(args.task_arg), precision=args.precision, steps=args.steps,
        seed=args.seed, out=args.out, ckpt_every=args.ckpt_every, keep=args.keep, log_every=args.log_every,
        resume=args.resume, max_grad_norm=args.max_grad_norm or None, accumulation_steps=args.accumulation_steps,
        lr=args.lr, device=args.device, fused=False if args.no_fused else None, tf32=args.tf32,
        tensorboard=args.tensorboard, strategy=args.strategy, init_scale=args.init_scale,
        fp32_modules=args.fp32_modules, graph=False if args.no_graph else None, fp8_recipe=args.fp8_recipe,
        fp8_layers=args.fp8_layers, weights=args.weights,
        callbacks=tuple(args.callback), stop_signal=args.stop_signal, stop_check_every=args.stop_check_every,
    )
    config.validate()
    if args.nproc is not None:
        if config.out:  # before torchrun starts: one line here, not one per rank
            from pathlib import Path

            from ampkit.training.record import refuse_existing_run

            refuse_existing_run(Path(config.out), resume=config.resume)
        return _launch(args)
    with _Bar(enabled=main_rank and not args.json and sys.stderr.isatty()) as bar:
        result = train(config, progress=bar if main_rank else None)
    if main_rank and args.json:
        print_json(result.to_dict())
    elif main_rank:
        _summary(result)
    if result.interrupted_by:  # the shell's convention for "ended by signal N"
        return 128 + int(signal.Signals[result.interrupted_by])
    return 0


class _Bar(ProgressView):
    """A rich progress bar fed by the trainer's progress callback; plain lines when not a TTY."""

    def __init__(self, enabled: bool) -> None:
        super().__init__(enabled, counter="count")
        self.task_id = None

    def __call__(self, ev: dict) -> None:
        kind = ev.get("event")
        if kind == "start":
            self.err.print(f"[bold]{ev['task']}[/] on {ev['device']} in {ev['precision']}: {ev['reason']}")
            for note in ev.get("notes", []):
                self.err.print(f"note: {note}")
            if self.progress is not None:
                self.task_id = self.progress.add_task(ev["task"], total=ev["total"], completed=ev["start"], info="")
        elif kind == "log":
            loss = "nan" if ev["loss"] is None else f"{ev['loss']:.4f}"
            sps = f"{ev['samples_per_s']:.0f}/s" if ev.get("samples_per_s") else ""
            info = f"loss {loss} scale {ev['scale']:g} skipped {ev['skipped']} {sps}"
            if self.progress is not None:
                self.progress.update(self.task_id, completed=ev["step"], info=info)
            else:
                self.err.print(f"step {ev['step']}: {info}", highlight=False)
        elif kind == "warning":
            self.err.print(f"[yellow]warning {ev['code']}[/]: {ev['message']}. fix: {ev['fix']}")
        elif kind == "fp8_trial":
            from ampkit.cli.fp8view import fp8_trial_line

            line = fp8_trial_line(ev)
            if line:
                self.err.print(line, highlight=False, soft_wrap=True)


def _summary(r) -> None:
    out = console()
    loss = "n/a" if r.final_loss is None else f"{r.final_loss:.4f}"
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in r.metrics.items())
    out.print(f"[bold]{r.task}[/] {r.precision} on {r.device}: {r.steps} steps "
              f"({r.steps - r.start_step} this run) in {r.wall_s:.1f}s, final loss {loss}, skipped {r.skipped}")
    if metrics:
        out.print(f"eval: {metrics}")
    if r.samples_per_s:
        out.print(f"throughput: {r.samples_per_s:.0f} samples/s" +
                  (f", peak memory {r.peak_mem_bytes / 2**20:.0f} MiB" if r.peak_mem_bytes else ""))
    for note in r.notes:
        out.print(f"note: {note}")
    for w in r.warnings:
        out.print(f"[yellow]warning {w['code']}[/]: {w['message']}. fix: {w['fix']}")
    if r.out:
        out.print(f"metrics: {r.out}/metrics.jsonl, checkpoints: {r.out}/checkpoints/")
    if r.interrupted_by:
        out.print(f"stopped by {r.interrupted_by} at step {r.steps}: checkpoint saved; continue with --resume")
