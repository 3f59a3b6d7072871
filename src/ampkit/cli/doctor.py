"""``ampkit doctor``: the device, what it supports (with provenance), what to use."""

from __future__ import annotations

from ampkit.cli.common import add_device_arg, add_precision_arg, console, print_json

EXAMPLES = """examples:
  ampkit doctor                       # table for people
  ampkit doctor --json                # stable JSON for scripts
  ampkit doctor --precision bf16      # exit 0 if BF16 is usable here, 1 with the reason if not
  AMPKIT_DEVICE=cpu ampkit doctor     # inspect another device
"""


def register(sub, formatter_class):
    p = sub.add_parser("doctor", help="what this device supports and which precision to use",
                       description="Device, card, capabilities with provenance (table / probe / unverified), "
                                   "recommended precision, TF32 state, versions and debugging variables.",
                       epilog=EXAMPLES, formatter_class=formatter_class)
    add_precision_arg(p, default=None)
    add_device_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON on stdout")
    p.add_argument("--no-probe", action="store_true", help="skip the run-time probe (table answers only)")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from ampkit.device import detect_device
    from ampkit.device.doctor import doctor_report

    report = doctor_report(detect_device(args.device), precision=args.precision, probe=not args.no_probe)
    check = report.get("check")
    if args.json:
        print_json(report)
    else:
        _render(report)
    return 1 if check is not None and not check["usable"] else 0


def _yn(value) -> str:
    return {True: "[green]yes[/]", False: "[red]no[/]", None: "[yellow]unknown[/]"}[value]


def _render(r: dict) -> None:
    from rich.table import Table

    out = console()
    d = r["device"]
    cap = f" · capability {d['capability'][0]}.{d['capability'][1]}" if d["capability"] else ""
    mem = f" · {d['total_memory_bytes'] / 2**30:.1f} GiB" if d["total_memory_bytes"] else ""
    out.print(f"[bold]{d['name']}[/] ({d['type']}{'' if d['index'] is None else ':' + str(d['index'])}{cap}{mem})")
    out.print(f"card: {r['card']['family']}")
    t = Table(title="capabilities", title_justify="left")
    for col in ("feature", "supported", "provenance", "detail", "probe"):
        t.add_column(col)
    rows = [(k.upper(), v) for k, v in r["dtypes"].items()] + [("TF32", r["tf32"]), ("FP8 training", r["fp8"]),
                                                               (f"collectives ({r['collectives']['backend']})", r["collectives"])]
    for label, s in rows:
        t.add_row(label, _yn(s["supported"]), s["provenance"], s["detail"] or "", s["probe"] or "")
    out.print(t)
    rec = r["recommended"]
    out.print(f"[bold]recommended:[/] --precision {rec['precision']}  ({rec['reason']})")
    if r["tf32"]["switches"]:
        out.print("TF32 switches: " + ", ".join(f"{k}={v}" for k, v in r["tf32"]["switches"].items()))
    out.print("versions: " + ", ".join(f"{k} {v}" for k, v in r["versions"].items() if v))
    env = ", ".join(f"{k}={v if v is not None else '(unset)'}" for k, v in r["env"].items())
    out.print(f"debug env: {env}")
    out.print(f"to find a failing op: rerun with {r['rerun_hint']}")
    for note in r["notes"]:
        out.print(f"note: {note}")
    check = r.get("check")
    if check is not None:
        if check["usable"]:
            out.print(f"[green]--precision {check['precision']} is usable here[/]: {check['reason']}")
        else:
            out.print(f"[red]--precision {check['precision']} is not usable here[/]: {check['reason']}")
