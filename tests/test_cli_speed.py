"""`crossbert --help` answers at once: the CLI module and every command's help import no heavy library.

Measured (farm-bench, 2-core CPU): `crossbert --help` 4.0 s -> 0.2 s once torch and transformers left the
import path. These tests keep it so: a top-level import of torch, transformers, mteb or pandas in cli.py or
in a module it imports at the top (crossbert_model/__init__.py, errors, defaults, args, train_config) fails here.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
import sys

from crossbert_eval.cli import build_parser

HEAVY = ("torch", "transformers", "mteb", "pandas", "sklearn", "faiss", "sentence_transformers", "matplotlib")


def _heavy_modules_after(code: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after running `code` (a subprocess: this one has them all)."""
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_cli_imports_no_heavy_library():
    # catches: a top-level `import torch` (or transformers, pandas, ...) in cli.py or a module it imports
    assert _heavy_modules_after("import crossbert_eval.cli") == []


def test_every_commands_help_imports_no_heavy_library():
    # catches: a command whose help text (or argument set-up) needs torch or transformers, e.g. train's config
    # keys read through a module that imports the model (crossbert_model.train_config's imports)
    commands = sorted(build_parser()._subparsers._group_actions[0].choices)
    code = (
        "from crossbert_eval.cli import build_parser\n"
        f"for argv in [['--help']] + [[c, '--help'] for c in {commands!r}]:\n"
        "    try:\n        build_parser().parse_args(argv)\n    except SystemExit:\n        pass"
    )
    assert "train" in commands and "probe" in commands
    assert (
        _heavy_modules_after(
            "import contextlib, io\nwith contextlib.redirect_stdout(io.StringIO()):\n"
            + "\n".join("    " + line for line in code.splitlines())
        )
        == []
    )


def test_a_mistyped_name_is_refused_before_any_heavy_library_is_imported():
    # catches: a handler that imports torch, transformers or mteb before checking what the user named
    # (a mistyped --tasks took 8 s idle, 77 s loaded; now about 0.4 s)
    for argv in (
        ["probe", "minilm", "--tasks", "TRC"],
        ["geometry", "minilm", "--tasks", "SST2x"],
        ["mteb", "minilm", "--tasks", "STSBenchmrk"],
        ["probe", "./runs/no_such_run", "--tasks", "TREC"],
        ["probe", "minlm", "--tasks", "TREC"],  # a bare name, read as a hub id: not in the local cache, near an alias
        ["mteb", "org/not-in-the-cache@v2", "--tasks", "STSBenchmark"],  # a hub id the local cache does not hold
        ["probe", "minilm", "--tasks", "TREC", "--probe", "linaer"],
        ["probe", "minilm", "--tasks", "TREC", "--feature-transform", "centerd"],
        ["train", str(Path(__file__).parents[1] / "configs/train/tiny_mlm.yaml"), "model.preset=tinny", "--print-config"],
    ):
        code = (
            "import contextlib, io\nfrom crossbert_eval.cli import main\n"
            f"with contextlib.redirect_stderr(io.StringIO()) as err:\n    try:\n        main({argv!r})\n    except SystemExit as e:\n"
            "        assert e.code == 2, err.getvalue()\n    said = err.getvalue()\n"
            "    assert any(words in said for words in ('did you mean', 'no such folder', 'not in the local')), said"
        )
        assert _heavy_modules_after(code) == [], argv


def test_a_task_only_mteb_can_judge_is_refused_before_the_model_is_loaded(tmp_path):
    # catches: `crossbert mteb` loading the encoder (the model classes, transformers' modelling code) before asking
    # mteb whether the task exists (14.9 s -> 5.7 s for a mistyped name, idle 2-core machine)
    code = (
        "import contextlib, io\nfrom crossbert_eval.cli import main\n"
        "with contextlib.redirect_stderr(io.StringIO()) as err:\n    try:\n"
        f"        main(['mteb', 'minilm', '--tasks', 'STS99', '--out', {str(tmp_path / 'm')!r}])\n"
        "    except SystemExit as e:\n        assert e.code == 2, err.getvalue()\n"
        "    assert 'STS99' in err.getvalue(), err.getvalue()\n"
        "import sys\nloaded = [m for m in ('crossbert_eval.encoders', 'crossbert_model.model', 'transformers.modeling_utils') "
        "if m in sys.modules]\nassert not loaded, loaded"
    )
    assert "mteb" in _heavy_modules_after(code)  # mteb alone judged the name
    assert not (tmp_path / "m").exists()
