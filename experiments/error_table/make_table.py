"""The CLI error table, measured: every row of tests/test_cli.py CASES run as a real `crossbert`
process (stdin answering "y", real read-only folders via chattr +i, real full disks via small tmpfs mounts, a
real second trainer), with its exit code, stderr and what it left on disk.

    sudo python experiments/error_table/make_table.py [CASE-SUBSTRING ...] > results/error_table/table.md

Needs root (mount, chattr) and the real data root; scratch under $ERROR_TABLE_SCRATCH (default
/tmp/error_table). The test suite checks the same cases in-process; this is the real-process view."""

import contextlib, json, os, re, shlex, shutil, signal, subprocess, sys, time
from pathlib import Path

WT = Path(__file__).resolve().parents[2]  # the repository root
sys.path[:0] = [str(WT), str(WT / "tests")]
SCRATCH = Path(os.environ.get("ERROR_TABLE_SCRATCH", "/tmp/error_table"))
os.environ.setdefault("HF_HOME", str(SCRATCH / "hf"))
import test_cli as T  # noqa: E402
from crossbert_model.data.sequences import prepare_data  # noqa: E402
from crossbert_model.data_args import DataArgs  # noqa: E402
from crossbert_model.utils import data_root  # noqa: E402

PY = sys.executable
OUT = SCRATCH / "cases"
corpus_args = DataArgs(
    corpus=str(data_root() / "wikipedia_en_2015"),
    vocab_size=2048,
    seq_len=64,
    max_documents=150,
    val_fraction=0.05,
    cache_dir=str(SCRATCH / "cache"),
)
prepare_data(corpus_args)
only = sys.argv[1:]


def crossbert(argv, env, stdin=None, wait=True):
    env = {**env, "PYTHONPATH": str(WT)}  # this worktree's code, not the venv's editable install of main
    cmd = ["nice", "-n", "19", PY, "-m", "crossbert_eval.cli", *argv]
    if not wait:
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=env, input=stdin, capture_output=True, text=True)


@contextlib.contextmanager
def mounted(folder: Path, size: str):
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        yield
    finally:
        snapshot = sorted(str(p.relative_to(folder.parent)) for p in folder.rglob("*") if p.is_file())
        (folder.parent / f".{folder.name}.left").write_text("\n".join(snapshot))
        subprocess.run(["umount", str(folder)], check=True)


@contextlib.contextmanager
def immutable(folder: Path):
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["chattr", "+i", str(folder)], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


REAL = {  # the real counterpart of a row's in-process `around`
    "read-only results folder": lambda t: immutable(t / "r"),
    "read-only output folder": lambda t: immutable(t / "runs"),
    "disk full during a feature write": lambda t: mounted(t / "f", "200k"),
    "disk full during a checkpoint": lambda t: mounted(t / "runs", "700k"),
}
STDIN = {name: "y\n" * 20 for name in T.CASES if "stdin says y" in name}
INPUTS = {"in", "tasks", "model", "nano", "data", "corpus.txt", "empty-hub-cache", "cache"}


def left_behind(t: Path) -> str:
    files = []
    for p in sorted(t.rglob("*")):
        rel = p.relative_to(t)
        if rel.parts[0] in INPUTS or p.name.endswith(".left"):
            continue
        if p.is_file():
            files.append(str(rel))
    for marker in t.glob(".*.left"):
        files += [f"{line} (on the full disk, before unmount)" for line in marker.read_text().splitlines() if line]
    return ", ".join(files) or "nothing"


def run_case(name, case):
    t = OUT / re.sub(r"[^\w]+", "_", name).strip("_")
    shutil.rmtree(t, ignore_errors=True)
    t.mkdir(parents=True)
    case_env = case.env(t)
    env = {**os.environ, "CROSSBERT_DEBUG": "0", **case_env}
    argv = case.argv(t, corpus_args)
    if name == "a run folder another trainer holds":
        argv += ["steps=400", "eval_every=50", "checkpoint_every=50"]  # long enough for the second to meet the first
    command = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in case_env.items()), "crossbert", shlex.join(argv)])
    if name == "a run folder another trainer holds":
        return two_trainers(t, env, argv) + (command,)
    if name in ("a results line that is JSON but no object", "results.jsonl that is a folder"):
        case.around(t).__enter__()  # creates the results file (a plain set-up, no patch)
    around = REAL.get(name, lambda t: contextlib.nullcontext())
    with around(t):
        done = crossbert(argv, env, STDIN.get(name))
    return done.returncode, done.stderr.strip(), left_behind(t), command


def two_trainers(t, env, argv):
    first = crossbert(argv, env, wait=False)
    owner = t / "runs" / "cli" / ".lock.owner.json"
    while first.poll() is None and not owner.exists():
        time.sleep(0.2)
    second = crossbert(argv, env)
    first.send_signal(signal.SIGTERM)
    _, first_err = first.communicate()
    again = crossbert(argv, env)
    steps = [json.loads(l)["step"] for l in (t / "runs" / "cli" / "metrics.jsonl").read_text().splitlines()]
    extra = (
        f" || first trainer, SIGTERM: exit {first.returncode}, {first_err.strip().splitlines()[-1] if first_err.strip() else ''!r}"
        f" || same command again: exit {again.returncode}; metrics.jsonl steps {steps[0]}..{steps[-1]}, {len(steps)} rows, "
        f"{len(set(steps))} distinct"
    )
    return second.returncode, second.stderr.strip() + extra, left_behind(t)


rows = []
for name, case in T.CASES.items():
    if only and not any(o in name for o in only):
        continue
    code, err, left, command = run_case(name, case)
    rows.append({"case": name, "command": command, "exit": code, "stderr": err, "left": left})
    print(f"{name}: exit {code}", file=sys.stderr, flush=True)


def cell(text: str) -> str:
    for path, name in ((SCRATCH, "$SCRATCH"), (data_root(), "$DATA_ROOT"), (WT, ".")):
        text = text.replace(str(path), name)
    return text.replace("|", "\\|").replace("\n", "<br>")


print("| case | command | exit | stderr (log lines, then the error) | left on disk |\n|---|---|---|---|---|")
for r in rows:
    print(f"| {r['case']} | {cell(r['command'])} | {r['exit']} | {cell(r['stderr'])} | {cell(r['left'])} |")
