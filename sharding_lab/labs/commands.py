"""`sharding-lab list` and `sharding-lab run`: the labs from the command line.

    sharding-lab list [--json]
    sharding-lab run LAB [--world-size N] [--json]
    sharding-lab run --all [--world-size N] [--json] [--export exports/lab-results.json]
    sharding-lab serve-labs [--idle-timeout S]     (one JSON request per stdin line: the app's lab worker)
    sharding-lab at-scale [LAB] [--write] [--json] (each lab's configurations at 7b x 64 and 70b x 1024 GPUs)

`run` exits 1 when a claim does not hold (or the engine fails), so CI can run every lab. `--json`
prints exactly one JSON object: a run, or {"runs": [...], "rank_s", "wall_s"} for --all (rank_s: the
seconds the ranks spent measuring; wall_s: the whole command's). Progress goes to stderr, and only to a
terminal. The labs of one command share warm ranks, one pool per world size (sharding_lab.engine.pool).
"""

from __future__ import annotations

import argparse
import errno
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sharding_lab.cli_args import positive_float, timeout_seconds
from sharding_lab.labs.evaluate import write_summaries
from sharding_lab.labs.registry import LABS, get_lab
from sharding_lab.run_config import DEVICES

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def register(subparsers) -> None:
    """Add the `list` and `run` subcommands to the sharding-lab CLI (dispatched through args.func)."""
    list_parser = subparsers.add_parser(
        "list",
        help="the labs: id, title, claim and the questions each backs",
        description="List every lab with the claim it checks and the bank questions it backs.",
    )
    list_parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    list_parser.set_defaults(func=run_list)

    run_parser = subparsers.add_parser(
        "run",
        help="run a lab (or --all): measure, check the claim, report the numbers",
        description="Run a lab's sharded configurations on real ranks (CPU, or CUDA with --device cuda), "
        "check its claim against the "
        "measurements and report the finding. Exits 1 when a claim does not hold.",
    )
    run_parser.add_argument("lab", nargs="?", help="lab id (see `sharding-lab list`)")
    run_parser.add_argument("--all", action="store_true", help="run every lab, sharing launches")
    run_parser.add_argument("--world-size", type=int, default=2, help="ranks N (default 2); a lab comparing world sizes also runs 2N (and 1)")
    run_parser.add_argument("--size", default="tiny", help="model size (default tiny)")
    run_parser.add_argument(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="cpu (gloo, default) or cuda (NCCL, one GPU per rank; with fewer GPUs than ranks, the ranks "
        "share cuda:0 over gloo)",
    )
    run_parser.add_argument("--timeout", type=timeout_seconds, default=600.0,
                            help="seconds for each launch, start-up included, before it is ended (default 600; "
                            "a large --size on CPU ranks needs more)")
    run_parser.add_argument("--json", action="store_true", help="print one JSON object")
    run_parser.add_argument(
        "--export",
        type=Path,
        metavar="PATH",
        help="also write {lab id: run without measurements and charts} to PATH (e.g. exports/lab-results.json); "
        "its folder must exist",
    )
    run_parser.set_defaults(func=run_run)

    serve_parser = subparsers.add_parser(
        "serve-labs",
        help="run labs on warm ranks, one JSON request per stdin line (what the study app's worker talks to)",
        description="Answer {\"lab\": ID, \"world_size\": N} lines on stdin with {\"result\": RUN} or "
        "{\"error\": ...} lines on stdout, keeping a pool of ranks per world size between requests.",
    )
    serve_parser.add_argument("--idle-timeout", type=positive_float, default=300.0,
                              help="seconds a pool of ranks stays up without a lab (default 300)")
    serve_parser.add_argument("--timeout", type=timeout_seconds, default=600.0,
                              help="seconds, start-up included, before a hung run is ended (default %(default)g)")
    serve_parser.set_defaults(func=run_serve_labs)

    scale_parser = subparsers.add_parser(
        "at-scale",
        help="each lab's configurations at 7b on 64 GPUs and 70b on 1024 (peak per GPU, fit, bytes sent)",
        description="Print every lab's at-scale line. --write first simulates each FSDP configuration "
        "(FSDP2 under FakeTensorMode, a few seconds each) and stores the peaks the lines read.",
    )
    scale_parser.add_argument("lab", nargs="?", help="one lab id (default: every lab)")
    scale_parser.add_argument("--write", action="store_true",
                              help="simulate every lab's FSDP configurations and store the figures first")
    scale_parser.add_argument("--json", action="store_true", help="print one JSON object {lab id: line}")
    scale_parser.set_defaults(func=run_at_scale)


def run_at_scale(args: argparse.Namespace) -> int:
    from sharding_lab.labs.at_scale import at_scale_line, simulated_figures

    if (refused := _unknown_lab([args.lab] if args.lab else [])) is not None:
        return _usage_error("at-scale", refused)
    labs = [get_lab(args.lab)] if args.lab else list(LABS.values())
    if args.write:
        from sharding_lab.engine.at_scale import write_simulated_figures

        document = write_simulated_figures(LABS.values(), lambda text: print(f"simulating {text}", file=sys.stderr))
        simulated_figures.cache_clear()
        print(f"wrote {len(document['figures'])} simulated configurations in {document['seconds']} s", file=sys.stderr)
    lines = {lab.id: at_scale_line(lab) for lab in labs}
    if args.json:
        print(json.dumps(lines))
    else:
        for lab_id, line in lines.items():
            print(f"{lab_id}: {line}\n")
    return 0


def run_list(args: argparse.Namespace) -> int:
    labs = [
        {
            "id": lab.id,
            "title": lab.info.title,
            "claim": lab.info.claim,
            "questions": list(lab.info.questions),
            "command": lab.info.command,
            # What `run` measures at the default 2 ranks: one engine configuration per entry.
            "runs": [spec.to_json() for spec in lab.runs(2)],
        }
        for lab in LABS.values()
    ]
    if args.json:
        print(json.dumps({"labs": labs}))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Labs", show_lines=True)
    table.add_column("id", no_wrap=True)  # what `sharding-lab run` takes: never broken across lines
    for column in ("title", "claim", "questions"):
        table.add_column(column, overflow="fold")
    for lab in labs:
        table.add_row(lab["id"], lab["title"], lab["claim"], "\n".join(lab["questions"]))
    Console().print(table)
    return 0


def _unknown_lab(lab_ids: list[str]) -> str | None:
    """What is wrong with the first lab id that names no lab, or None."""
    try:
        for lab_id in lab_ids:
            get_lab(lab_id)
    except KeyError as error:
        return str(error.args[0])
    return None


def _usage_error(command: str, message: str) -> int:
    """A request refused before anything ran: exit status 2, as argparse's own (1 is a claim that fails)."""
    print(f"sharding-lab {command}: {message}", file=sys.stderr)
    return 2


# What creating a file in the --export folder failed with, in words; any other errno in the OS's own.
_CANNOT_WRITE_IN = {
    errno.EACCES: "no permission to write in {folder}",
    errno.EPERM: "no permission to write in {folder}",
    errno.EROFS: "{folder} is on a read-only file system",
    errno.ENOSPC: "no space left on the disk of {folder}",
    errno.EDQUOT: "the disk quota of {folder} is used up",
}


def _cannot_write_in(folder: Path, error: OSError) -> str:
    """Why no file could be made in `folder`, by the error's errno."""
    why = _CANNOT_WRITE_IN.get(error.errno)
    return why.format(folder=folder) if why else f"cannot write in {folder}: {error.strerror or error}"


def _export_problem(path: Path) -> str | None:
    """Why `--export PATH` could not be written, found before the labs run rather than after: a
    folder, a parent folder that is missing (none is made, as `studyapp export-history --out` makes
    none) or a file, or one no file can be made in (tried, and named by the error's errno)."""
    folder = path.parent
    if path.is_dir():
        return f"--export {path} is a folder; give a file path such as {path / 'lab-results.json'}"
    if not folder.is_dir():
        if folder.exists():
            return f"--export {path}: {folder} is a file, not a folder"
        return f"--export {path}: no folder {folder}; make it first (mkdir -p {folder})"
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        return f"--export {path}: {_cannot_write_in(folder, error)}"
    return None


def run_run(args: argparse.Namespace) -> int:
    if args.all == bool(args.lab):
        return _usage_error("run", "name one LAB or pass --all (see `sharding-lab list`)")
    if args.world_size < 2:
        return _usage_error("run", "--world-size must be at least 2 (one rank shards and sends nothing)")
    lab_ids = list(LABS) if args.all else [args.lab]
    if (refused := _unknown_lab(lab_ids) or (_export_problem(args.export) if args.export else None)) is not None:
        return _usage_error("run", refused)

    started, timings = time.perf_counter(), {}
    try:
        runs = _run_with_progress(lab_ids, args.world_size, args.size, args.device, timings, args.timeout)
    except ValueError as error:  # refused before any rank started, e.g. too little host memory
        print(f"sharding-lab run: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # the engine failed: a rank crashed or hung
        from sharding_lab.engine.launch import for_user

        print(f"sharding-lab run: the engine failed: {for_user(error)}", file=sys.stderr)
        return 1
    export_failed = None
    if args.export:
        try:
            write_summaries(runs, args.export)
        except OSError as error:  # what only writing finds (e.g. a file system that takes no new files)
            export_failed = f"could not write --export {args.export}: {error.strerror or error}; the runs are not exported"
    if args.json:
        wall_s = time.perf_counter() - started
        print(json.dumps({"runs": runs, "rank_s": timings.get("rank_s"), "wall_s": wall_s} if args.all else runs[0]))
    else:
        _print_runs(runs)
    if export_failed:
        print(f"sharding-lab run: {export_failed}", file=sys.stderr)
        return 1
    return 0 if all(run["holds"] for run in runs) else 1


def run_serve_labs(args: argparse.Namespace) -> int:
    from sharding_lab.engine import lab_server

    return lab_server.main(idle_timeout_s=args.idle_timeout, timeout_s=args.timeout)


def _run_with_progress(lab_ids: list[str], world_size: int, size: str, device: str, timings: dict,
                       timeout_s: float) -> list[dict]:
    from sharding_lab.engine.run_labs import run_labs  # torch, only when something runs

    if not sys.stderr.isatty():
        return run_labs(lab_ids, world_size, size=size, device=device, timings=timings, timeout_s=timeout_s)
    from rich.console import Console

    console = Console(stderr=True, log_path=False)
    with console.status("starting") as status:

        def on_progress(message: str) -> None:
            console.log(message)
            status.update(message)

        def on_status(message: str) -> None:
            status.update(message)

        return run_labs(
            lab_ids, world_size, size=size, device=device, on_progress=on_progress, on_status=on_status,
            timings=timings, timeout_s=timeout_s,
        )


def _print_runs(runs: list[dict]) -> None:
    from rich.console import Console
    from rich.markup import escape

    console = Console()
    for run in runs:
        verdict = "[green]holds[/green]" if run["holds"] else "[bold red]does NOT hold[/bold red]"
        console.rule(f"{run['lab']}: {run['title']}")
        console.print(f"[bold]Claim[/bold] {escape(run['claim'])}", highlight=False)
        console.print(f"[bold]Verdict[/bold] {verdict}  ({run['duration_s']:.1f} s)")
        console.print(f"[bold]Finding[/bold] {escape(run['finding'])}", highlight=False)
        if run.get("at_scale"):
            console.print(f"[bold]At scale[/bold] {escape(run['at_scale'])}", highlight=False)
        console.print(_lab_table(run["table"], console))
        for reason in run["reasons"]:
            console.print(
                f"  {'✗' if reason.startswith('NOT') else '✓'} {reason}", markup=False, highlight=False
            )
    held = sum(run["holds"] for run in runs)
    console.print(f"\n{held} of {len(runs)} claims held.")


def _lab_table(table: dict, console: Console) -> Table:
    """A run's table laid out to read at the console's width with no word broken: a row per
    configuration; where its words do not fit (6 labs' 7 or 8 columns at 80 characters), a column per
    configuration, as a lab compares a few of them by many figures; failing that too (long tensor
    names), each configuration's figures under each other. Only a word wider than that is folded."""
    from rich.table import Table

    from sharding_lab.table_widths import fit_words

    def laid_out(header: list[str], rows: list[list[str]]) -> Table:
        laid = Table()
        for column in header:
            laid.add_column(column)
        for row in rows:
            laid.add_row(*row)
        return laid

    columns = [str(column) for column in table["columns"]]
    rows = [[_cell(value) for value in row] for row in table["rows"]]
    by_row = laid_out(columns, rows)
    if fit_words(by_row, console):
        return by_row
    by_column = laid_out([columns[0], *(row[0] for row in rows)],
                         [[column, *(row[index] for row in rows)] for index, column in enumerate(columns) if index])
    if fit_words(by_column, console):
        return by_column
    records = Table(show_header=False)
    records.add_column()
    records.add_column(overflow="fold")
    for row in rows:
        for index, (column, value) in enumerate(zip(columns, row, strict=True)):
            records.add_row(column, value, end_section=index == len(columns) - 1)
    return fit_words(records, console) or records


def _cell(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "" if value is None else str(value)
