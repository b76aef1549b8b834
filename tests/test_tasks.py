"""Task files: every declared split of the real data parses to the counts of MANIFEST.md, and bad
task files / data stop with messages that name the file, the line or field, and the expectation."""

import csv
import lzma

import numpy as np
import pytest

from crossbert_eval.tasks import TaskDataMissing, TaskError, all_tasks, get_task, parse_task_file, resolve_tasks

# (task, split) -> examples, from MANIFEST.md (MRPC train: the file holds 3,667 data lines + header)
EXPECTED = {
    ("CoLA", "train"): 8551,
    ("CoLA", "validation"): 1043,
    ("SST-2", "train"): 67349,
    ("SST-2", "validation"): 872,
    ("SST-2", "test"): 1821,
    ("MRPC", "validation"): 408,
    ("RTE", "train"): 2490,
    ("RTE", "validation"): 277,
    ("WNLI", "train"): 635,
    ("WNLI", "validation"): 71,
    ("QNLI", "validation"): 5463,
    ("STS-B", "train"): 5749,
    ("STS-B", "validation"): 1500,
    ("STSBenchmark", "test"): 1379,
    ("SICK-R", "test"): 9840,
    ("STS12", "test"): 3108,
    ("STS13", "test"): 1500,
    ("STS14", "test"): 3750,
    ("STS15", "test"): 3000,
    ("STS16", "test"): 1186,
    ("TREC", "train"): 5452,
    ("TREC", "test"): 500,
    ("Banking77Classification", "train"): 10003,
    ("Banking77Classification", "test"): 3080,
    ("EmotionClassification", "train"): 16000,
    ("EmotionClassification", "test"): 2000,
    ("TweetSentimentExtractionClassification", "test"): 3534,
    ("AmazonCounterfactualClassification", "train"): 4018,
    ("AmazonCounterfactualClassification", "test"): 670,
    ("STS17", "test"): 250,
    ("BIOSSES", "test"): 100,
    ("MassiveIntentClassification", "train"): 11514,
    ("MassiveIntentClassification", "validation"): 2033,
    ("MassiveIntentClassification", "test"): 2974,
    ("MassiveScenarioClassification", "train"): 11514,
    ("MassiveScenarioClassification", "validation"): 2033,
    ("MassiveScenarioClassification", "test"): 2974,
    ("ImdbClassification", "train"): 25000,
    ("ImdbClassification", "test"): 25000,
    ("SciFact", "train"): 919,
    ("SciFact", "test"): 339,  # judged (claim, abstract) pairs: the qrels rows
    ("TwitterURLCorpus-lowercasedtrain", "train"): 42200,
    ("TwitterURLCorpus-lowercasedtrain", "test"): 9334,
    ("BigramShift", "train"): 10000,
    ("BigramShift", "test"): 10000,
    ("CoordinationInversion", "train"): 10000,
    ("CoordinationInversion", "test"): 10002,
    ("Tense", "train"): 10000,
    ("Tense", "test"): 10000,
    ("SubjNumber", "train"): 10000,
    ("SubjNumber", "test"): 10000,
    ("TreeDepth", "train"): 10000,
    ("TreeDepth", "test"): 10000,
}


@pytest.mark.parametrize("task,split", sorted(EXPECTED))
def test_real_splits_have_the_manifest_counts(real_data_root, task, split):
    data = get_task(task).load_split(split)
    assert len(data) == EXPECTED[(task, split)]
    assert all(t.strip() for t in data.texts)


def test_glue_reading_matches_an_independent_quote_free_reader(real_data_root):
    """RTE dev: bare quotes must not merge lines, labels map entailment -> 0."""
    with open(real_data_root / "glue/RTE/dev.tsv", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    split = get_task("RTE").load_split("validation")
    assert split.texts == [r[1] for r in rows] and split.texts_pair == [r[2] for r in rows]
    assert split.labels.tolist() == [0 if r[3] == "entailment" else 1 for r in rows]


def test_mrpc_bom_and_stsb_extra_fields_and_sick_crlf(real_data_root):
    mrpc = get_task("MRPC").load_split("validation")
    assert set(np.unique(mrpc.labels)) == {0, 1}
    stsb = get_task("STS-B").load_split("train")  # 197 train lines carry 2 source fields
    assert stsb.labels.min() >= 0 and stsb.labels.max() <= 5
    sick = get_task("SICK-R").load_split("test")
    assert not any("\r" in t for t in sick.texts_pair) and 1 <= sick.labels.min() and sick.labels.max() <= 5


def test_sts_files_drop_pairs_without_gold_scores(real_data_root):
    with lzma.open(real_data_root / "sts_semeval/2016/headlines.test.tsv.xz", "rt") as f:
        lines = [line.split("\t") for line in f.read().splitlines()]
    scored = sum(1 for parts in lines if parts[0].strip())
    assert scored < len(lines)  # the file does hold unscored pairs
    assert len(get_task("STS16").load_split("test")) == 1186


def test_qnli_is_probe_only_with_a_fixed_holdout(real_data_root):
    task = get_task("QNLI")
    dev, train, test = (task.load_split(s) for s in ("validation", "holdout_train", "holdout_test"))
    pairs = lambda split: sorted(zip(split.texts, split.texts_pair, split.labels.tolist()))  # noqa: E731
    assert sorted(pairs(train) + pairs(test)) == pairs(dev)
    assert not set(train.texts) & set(test.texts)  # split by question: no question on both sides
    assert 0.4 < len(test) / len(dev) < 0.6
    assert task.train_split == "holdout_train" and task.eval_splits == ["holdout_test"]


def test_missing_data_is_reported_with_where_it_looked(real_data_root):
    with pytest.raises(TaskDataMissing, match=r"task MNLI .*looked for .*glue/MNLI/train.tsv"):
        get_task("MNLI").load_split("train")


def test_unknown_task_lists_the_known_ones():
    with pytest.raises(TaskError, match=r"unknown task 'SST2'.*SST-2"):
        get_task("SST2")


def test_task_lookup_by_family_and_case():
    assert [t.name for t in resolve_tasks("sts")] == sorted(t.name for t in all_tasks().values() if t.family == "sts")
    assert get_task("sst-2").name == "SST-2"


def _task_file(tmp_path, body: str, data: dict[str, str]):
    folder = tmp_path / "data" / "toy"
    folder.mkdir(parents=True)
    for name, text in data.items():
        (folder / name).write_text(text)
    path = tmp_path / "Toy.yaml"
    path.write_text(body)
    return parse_task_file(path), tmp_path / "data"


TOY = """
name: Toy
family: glue
input: single
target: class
metrics: [accuracy]
data: {local: toy, format: tsv, header: true}
splits: {train: train.tsv, validation: dev.tsv}
columns: {text: sentence, label: label}
labels: [0, 1]
"""


def test_tsv_row_with_wrong_field_count_names_file_and_line(tmp_path):
    task, root = _task_file(
        tmp_path, TOY, {"train.tsv": "sentence\tlabel\ngood\t1\nbad\t0\textra\n", "dev.tsv": "sentence\tlabel\n"}
    )
    with pytest.raises(TaskError, match=r"train.tsv:3: expected 2 TSV fields \(sentence, label\), got 3"):
        task.load_split("train", root)


TOY_STS = (
    TOY.replace("target: class", "target: score")
    .replace("metrics: [accuracy]", "metrics: [spearman]")
    .replace("labels: [0, 1]\n", "")
)


def test_a_split_on_which_the_metric_is_undefined_is_refused_when_read_before_anything_is_encoded(tmp_path):
    task, root = _task_file(
        tmp_path, TOY, {"train.tsv": "sentence\tlabel\ngood\t1\nfine\t1\n", "dev.tsv": "sentence\tlabel\nok\t1\n"}
    )
    with pytest.raises(TaskError, match=r"train.tsv: split 'train' of task Toy: every example has class 1: a probe needs two"):
        task.load_split("train", root)
    assert task.load_split("validation", root).labels.tolist() == [1]  # one class to score on is defined (accuracy)
    constant = {"train.tsv": "sentence\tlabel\na\t1.0\nb\t2.0\n", "dev.tsv": "sentence\tlabel\nc\t3.0\nd\t3.0\n"}
    task, root = _task_file(tmp_path / "sts", TOY_STS, constant)
    with pytest.raises(
        TaskError, match=r"dev.tsv: split 'validation' of task Toy: every gold score is 3: a correlation with a constant"
    ):
        task.load_split("validation", root)
    task, root = _task_file(tmp_path / "nan", TOY_STS, {**constant, "train.tsv": "sentence\tlabel\na\tnan\nb\t2.0\n"})
    with pytest.raises(TaskError, match=r"train.tsv: split 'train' of task Toy: 1 gold score\(s\) are not finite numbers"):
        task.load_split("train", root)


def test_empty_split_is_an_error(tmp_path):
    task, root = _task_file(tmp_path, TOY, {"train.tsv": "sentence\tlabel\nok\t1\n", "dev.tsv": "sentence\tlabel\n"})
    with pytest.raises(TaskError, match=r"dev.tsv: split 'validation' of task Toy is empty"):
        task.load_split("validation", root)


def test_label_outside_the_mapping_names_line_and_column(tmp_path):
    task, root = _task_file(tmp_path, TOY, {"train.tsv": "sentence\tlabel\nok\t1\nodd\t2\n", "dev.tsv": "x"})
    with pytest.raises(TaskError, match=r"train.tsv:3: label '2' in column 'label' is not in the task's label mapping \(0, 1\)"):
        task.load_split("train", root)


def test_class_task_without_labels_is_refused(tmp_path):
    with pytest.raises(TaskError, match="a class task needs `labels`"):
        _task_file(tmp_path, TOY.replace("labels: [0, 1]\n", ""), {})


def test_unknown_task_field_is_refused(tmp_path):
    with pytest.raises(TaskError, match=r"unknown field\(s\) lables"):
        _task_file(tmp_path, TOY + "lables: [0, 1]\n", {})


# ------------------------------------------------------------------------------------------------
# Typed nested sections
# ------------------------------------------------------------------------------------------------


def test_every_task_file_loads_with_typed_sections():
    from pathlib import Path

    from crossbert_eval.tasks import ColumnsSpec, DataSpec, broken_tasks, tasks_dir

    files = [p for p in Path(tasks_dir()).glob("**/*.yaml") if not p.name.startswith("_")]
    assert broken_tasks() == {} and len(all_tasks()) == len(files)
    for task in all_tasks().values():
        assert isinstance(task.data, DataSpec) and isinstance(task.columns, ColumnsSpec)


@pytest.mark.parametrize(
    "old,new,message",
    [
        (
            "data: {local: toy, format: tsv, header: true}",
            "data: {local: toy, format: tsv, heder: true}",
            r"Toy.yaml: unknown key data.heder; valid keys under data: local, hub, format, header, fields, optional_fields, delimiter, quoting, encoding, drop_unlabelled, drop_labels, corpus, queries$",
        ),
        (
            "data: {local: toy, format: tsv, header: true}",
            "data: {local: toy, hub: {path: x, nmae: y}}",
            r"Toy.yaml: unknown key data.hub.nmae; valid keys under data.hub: path, name, revision, splits, columns$",
        ),
        (
            "columns: {text: sentence, label: label}",
            "columns: {text: sentence, label: label, lable: x}",
            r"Toy.yaml: unknown key columns.lable; valid keys under columns: text, text_pair, label, group, label_before$",
        ),
        (
            "labels: [0, 1]",
            "labels: [0, 1]\nholdout: {source: train, train: a, test: b, test_fraction: 0.5, sede: 1}",
            r"Toy.yaml: unknown key holdout.sede; valid keys under holdout: source, train, test, test_fraction, seed, group$",
        ),
        (
            "labels: [0, 1]",
            "labels: [0, 1]\nmteb: {type: Classification, eval_split: [test]}",
            r"Toy.yaml: unknown key mteb.eval_split; valid keys under mteb: type, eval_splits, train_split, subset, seed, .*max_score, variant_of, data_differs, from_splits$",
        ),
        (
            "data: {local: toy, format: tsv, header: true}",
            "data: {local: toy, format: tab}",
            r"Toy.yaml: data.format must be one of tsv, csv, jsonl, label_first, beir, got 'tab'",
        ),
        (
            "data: {local: toy, format: tsv, header: true}",
            "data: {local: toy, header: 'no'}",
            r"Toy.yaml: data.header must be true or false, got 'no'",
        ),
        ("labels: [0, 1]", "labels: [0, 1]\nmteb: {eval_splits: [test]}", r"Toy.yaml: missing key mteb.type"),
        (
            "data: {local: toy, format: tsv, header: true}",
            "data: toy",
            r"Toy.yaml: data must be a mapping of keys, got str 'toy'",
        ),
    ],
)
def test_nested_section_mistakes_name_file_and_key(tmp_path, old, new, message):
    assert old in TOY
    with pytest.raises(TaskError, match=message):
        _task_file(tmp_path, TOY.replace(old, new), {})


def test_sections_are_typed_dataclasses_read_by_the_one_typed_loader(tmp_path):
    """Sections are attributes with their defaults; values are checked against the field types by
    crossbert_model.args.from_dict, worded the task files' way."""
    body = TOY.replace("labels: [0, 1]", "labels: [0, 1]\nmteb: {type: Classification, eval_splits: [test], min_score: 0}")
    task, _ = _task_file(tmp_path, body, {})
    assert task.mteb.type == "Classification" and task.mteb.eval_splits == ["test"] and task.mteb.seed is None
    assert task.mteb.min_score == 0.0 and isinstance(task.mteb.min_score, float)
    assert task.data.delimiter is None and task.data.header is True and task.columns.group is None


@pytest.mark.parametrize(
    "old,new,message",
    [
        ("metrics: [accuracy]", "metrics: accuracy", r"Toy.yaml: metrics must be a list, got 'accuracy'$"),
        (
            "data: {local: toy, format: tsv, header: true}",
            "data: {local: toy, fields: [a, [b]]}",
            r"Toy.yaml: data.fields\[1\] must be a string, got \['b'\]$",
        ),
        (
            "labels: [0, 1]",
            "labels: [0, 1]\nholdout: {source: train, train: a, test: b, test_fraction: 0.5, seed: x}",
            r"Toy.yaml: holdout.seed must be an integer, got 'x'$",
        ),
        ("name: Toy", "", r"Toy.yaml: missing field\(s\) name$"),
        (
            "columns: {text: sentence, label: label}",
            "columns: {text: sentence}",
            r"Toy.yaml: missing key columns.label \(required under columns: text, label\)$",
        ),
    ],
)
def test_values_of_the_wrong_type_name_file_and_key(tmp_path, old, new, message):
    assert old in TOY
    with pytest.raises(TaskError, match=message):
        _task_file(tmp_path, TOY.replace(old, new), {})


# ------------------------------------------------------------------------------------------------
# Data formats: readers registered by name
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def pipe_format():
    """A throwaway format, `pipe`: 'text|label' per line, registered by name and removed afterwards."""
    from crossbert_eval.tasks import formats

    def read_pipe(text, path, options):
        rows = []
        for lineno, line in enumerate(formats.text_lines(text), 1):
            if line.strip():
                text_, _, label = line.rpartition("|")
                if not text_:
                    raise TaskError(f"{path}:{lineno}: expected 'text|label', got {line!r}")
                rows.append((lineno, dict(zip(options.fields or ["text", "label"], [text_, label]))))
        return rows

    formats.register_format("pipe", read_pipe)
    yield "pipe"
    formats.READERS.pop("pipe")


def test_a_task_in_a_new_format_needs_a_registered_reader_and_a_task_file(tmp_path, pipe_format):
    """Adding a format touches no module of the package: register a reader, name it in data.format."""
    from crossbert_eval.tasks import format_names

    assert format_names()[-2:] == ("pipe", "beir")
    body = TOY.replace("format: tsv, header: true", "format: pipe, fields: [sentence, label]")
    body = body.replace("train: train.tsv, validation: dev.tsv", "train: train.txt, validation: dev.txt")
    task, root = _task_file(tmp_path, body, {"train.txt": "a | b|1\nc|0\n", "dev.txt": "e|1\n"})
    split = task.load_split("train", root)
    assert split.texts == ["a | b", "c"] and split.labels.tolist() == [1, 0]
    assert task.load_split("validation", root).texts == ["e"]
    task, root = _task_file(tmp_path / "again", body, {"train.txt": "a|1\n", "dev.txt": "nolabel\n"})
    with pytest.raises(TaskError, match=r"dev.txt:1: expected 'text\|label', got 'nolabel'"):
        task.load_split("validation", root)


def test_an_unregistered_format_lists_the_registered_ones(tmp_path, pipe_format):
    with pytest.raises(
        TaskError, match=r"Toy.yaml: data.format must be one of tsv, csv, jsonl, label_first, pipe, beir, got 'pip'"
    ):
        _task_file(tmp_path, TOY.replace("format: tsv", "format: pip"), {})


def test_a_format_name_is_registered_once():
    from crossbert_eval.tasks import register_format

    with pytest.raises(ValueError, match="data format 'tsv' is already registered"):
        register_format("tsv", lambda text, path, options: [])


def test_the_data_root_is_passed_not_remembered(tmp_path):
    """Two data roots in one process: each load reads its own root (inferred labels too)."""
    body = TOY.replace("labels: [0, 1]", "labels: infer")
    task, root_a = _task_file(
        tmp_path, body, {"train.tsv": "sentence\tlabel\na\tx\nb\ty\n", "dev.tsv": "sentence\tlabel\nc\tx\n"}
    )
    root_b = tmp_path / "other"
    (root_b / "toy").mkdir(parents=True)
    (root_b / "toy" / "train.tsv").write_text("sentence\tlabel\np\tx\nq\ty\nr\tz\n")
    assert task.load_split("train", root_a).texts == ["a", "b"]
    assert task.load_split("train", root_b).texts == ["p", "q", "r"]
    assert task.class_count(root_a) == 2 and task.class_count(root_b) == 3


# ------------------------------------------------------------------------------------------------
# A broken task file fails only the commands that use it
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def tasks_with_broken_files(tmp_path, monkeypatch):
    from pathlib import Path

    from crossbert_eval.tasks import tasks_dir

    folder = tmp_path / "tasks"
    for sub in ("senteval", "sts"):
        (folder / sub).mkdir(parents=True)
    real = Path(tasks_dir())
    (folder / "senteval" / "TREC.yaml").write_text((real / "senteval" / "TREC.yaml").read_text())
    (folder / "sts" / "STS14.yaml").write_text((real / "sts" / "STS14.yaml").read_text())
    (folder / "sts" / "STS13.yaml").write_text(
        (real / "sts" / "STS13.yaml").read_text().replace("  header: false", "  heder: false")
    )
    (folder / "sts" / "Garbled.yaml").write_text("name: Garbled\n  family: [sts\n")
    monkeypatch.setenv("CROSSBERT_TASKS_DIR", str(folder))
    return folder


def test_a_broken_file_leaves_other_tasks_usable(tasks_with_broken_files):
    from crossbert_eval.tasks import broken_tasks

    assert sorted(all_tasks()) == ["STS14", "TREC"]
    assert [t.name for t in resolve_tasks("TREC")] == ["TREC"] and get_task("sts14").name == "STS14"
    assert [t.name for t in resolve_tasks("senteval")] == ["TREC"]
    broken = broken_tasks()
    assert sorted(broken) == ["Garbled", "STS13"]
    assert broken["STS13"].endswith(
        "STS13.yaml: unknown key data.heder; valid keys under data: local, hub, format, header, "
        "fields, optional_fields, delimiter, quoting, encoding, drop_unlabelled, drop_labels, "
        "corpus, queries"
    )
    assert "Garbled.yaml:2: not valid YAML" in broken["Garbled"] and "\n" not in broken["Garbled"]


@pytest.mark.parametrize(
    "spec,message",
    [
        ("STS13", r"STS13.yaml: unknown key data.heder"),
        ("TREC,sts13", r"STS13.yaml: unknown key data.heder"),
        ("Garbled", r"Garbled.yaml:2: not valid YAML"),
        ("sts", r"2 broken task files: .*Garbled.yaml.* \| .*STS13.yaml"),
        ("all", r"2 broken task files"),
    ],
)
def test_asking_for_a_broken_task_raises_its_error(tasks_with_broken_files, spec, message):
    with pytest.raises(TaskError, match=message):
        resolve_tasks(spec)


def test_task_listing_shows_broken_files(tasks_with_broken_files, real_data_root):
    from crossbert_eval.tasks import task_listing

    lines, broken = task_listing(real_data_root)
    assert any(line.startswith("senteval") and "TREC" in line and "test=500" in line for line in lines)
    assert [line.split()[:2] for line in lines if line.startswith("BROKEN")] == [["BROKEN", "Garbled"], ["BROKEN", "STS13"]]
    assert sorted(broken) == ["Garbled", "STS13"]


def test_a_duplicate_name_makes_that_name_broken_not_the_others(tasks_with_broken_files):
    (tasks_with_broken_files / "senteval" / "TREC2.yaml").write_text(
        (tasks_with_broken_files / "senteval" / "TREC.yaml").read_text()
    )
    with pytest.raises(TaskError, match=r"TREC2.yaml: task name 'TREC' is also defined in .*TREC.yaml"):
        get_task("TREC")
    assert get_task("STS14").name == "STS14"


# ------------------------------------------------------------------------------------------------
# The sets of tasks the data root holds: what MANIFEST.md says beyond the split counts
# ------------------------------------------------------------------------------------------------


def test_sts12_is_complete_with_msrvid_from_stsbenchmark(real_data_root):
    """MTEB's STS12 is 3,108 pairs; MSRvid's 750 are the stsbenchmark rows with file MSRvid, year 2012test."""
    task = get_task("STS12")
    assert len(task.load_split("test", real_data_root)) == 3108 and not task.mteb.partial
    msrvid = [
        row for entry in task.splits["test"] if not isinstance(entry, str) for _, row in task._entry_rows(entry, real_data_root)
    ]
    assert len(msrvid) == 750 and {(r["file"], r["year"]) for r in msrvid} == {("MSRvid", "2012test")}


def test_new_sets_match_the_manifest_beyond_counts(real_data_root):
    intent, scenario = get_task("MassiveIntentClassification"), get_task("MassiveScenarioClassification")
    assert intent.class_count(real_data_root) == 60 and scenario.class_count(real_data_root) == 18
    assert "alarm" in scenario.label_mapping(real_data_root) and "alarm_set" in intent.label_mapping(real_data_root)
    twitter = get_task("TwitterURLCorpus-lowercasedtrain")
    train, test = (twitter.load_split(s, real_data_root) for s in ("train", "test"))
    assert len(train) + len(test) == 51534  # MTEB's TwitterURLCorpus test: original train + test
    assert twitter.mteb.variant_of == "TwitterURLCorpus" and twitter.name != "TwitterURLCorpus"
    assert all(t == t.lower() for t in train.texts[:500]) and any(t != t.lower() for t in test.texts[:500])
    scifact = get_task("SciFact").load_beir("test", real_data_root)
    assert (len(scifact.corpus), len(scifact.queries), sum(map(len, scifact.qrels.values()))) == (5183, 300, 339)
    assert len(get_task("SciFact").load_beir("train", real_data_root).queries) == 809


# SentEval probing (MANIFEST.md): examples per raw label; tree depth's training split only as its range over 7 classes
PROBING_LABELS = {
    ("BigramShift", "train"): {"I": 5101, "O": 4899},
    ("BigramShift", "test"): {"I": 5000, "O": 5000},
    ("CoordinationInversion", "train"): {"I": 4975, "O": 5025},
    ("CoordinationInversion", "test"): {"I": 5001, "O": 5001},
    ("Tense", "train"): {"PAST": 5006, "PRES": 4994},
    ("Tense", "test"): {"PAST": 5000, "PRES": 5000},
    ("SubjNumber", "train"): {"NN": 5062, "NNS": 4938},
    ("SubjNumber", "test"): {"NN": 5000, "NNS": 5000},
}


@pytest.mark.parametrize("task,split", sorted(PROBING_LABELS))
def test_probing_labels_have_the_manifest_balance(real_data_root, task, split):
    t = get_task(task)
    names = {i: raw for raw, i in t.label_mapping(real_data_root).items()}
    labels, counts = np.unique(t.load_split(split, real_data_root).labels, return_counts=True)
    assert {names[i]: n for i, n in zip(labels.tolist(), counts.tolist())} == PROBING_LABELS[(task, split)]


def test_probing_family_is_five_tasks_and_tree_depth_has_seven_depths(real_data_root):
    names = sorted(t.name for t in resolve_tasks("probing"))
    assert names == ["BigramShift", "CoordinationInversion", "SubjNumber", "Tense", "TreeDepth"]
    tree = get_task("TreeDepth")
    assert sorted(tree.label_mapping(real_data_root), key=int) == [str(d) for d in range(5, 12)]
    counts = np.bincount(tree.load_split("train", real_data_root).labels, minlength=7)
    assert (counts.min(), counts.max()) == (695, 1823)
    assert (np.bincount(tree.load_split("test", real_data_root).labels, minlength=7) > 0).all()


def test_imdb_reviews_keep_line_separators_inside_json_strings(real_data_root):
    """IMDB texts hold U+0085 / U+2028: jsonl lines split at "\\n" only, so every review parses whole."""
    split = get_task("ImdbClassification").load_split("test", real_data_root)
    assert len(split) == 25000 and np.bincount(split.labels).tolist() == [12500, 12500]
    assert max(len(t) for t in split.texts) > 10000  # long documents, unchanged


PASTE = """
name: Paste
family: sts
input: pair
target: score
metrics: [cosine_spearman]
data: {local: toy, format: tsv, header: false}
splits: {test: {paste: [pairs.zip/in/pairs.txt, gold.txt], fields: [s1, s2, score]}}
columns: {text: s1, text_pair: s2, label: score}
train_split: null
eval_split: test
"""


def _zip(folder, name: str, members: dict[str, str]) -> None:
    import zipfile

    with zipfile.ZipFile(folder / name, "w") as archive:
        for member, text in members.items():
            archive.writestr(member, text)


def test_pasted_files_read_side_by_side_and_zip_members_in_place(tmp_path):
    task, root = _task_file(tmp_path, PASTE, {"gold.txt": "1.5\n4\n"})
    _zip(root / "toy", "pairs.zip", {"in/pairs.txt": "a cat\ta dog\nrain\tsnow\n"})
    split = task.load_split("test", root)
    assert split.texts == ["a cat", "rain"] and split.texts_pair == ["a dog", "snow"] and split.labels.tolist() == [1.5, 4.0]


@pytest.mark.parametrize(
    "gold,pairs,message",
    [
        (
            "1.5\n",
            "a\tb\nc\td\n",
            r"gold.txt: 1 lines, but .*pairs.zip/in/pairs.txt has 2; pasted files need one line per example",
        ),
        (
            "1.5\n2\n",
            "a\tb\tc\nc\td\n",
            r"pairs.zip/in/pairs.txt, .*gold.txt: line 1: expected 3 fields \(s1, s2, score\), got 4",
        ),
    ],
)
def test_pasted_files_that_do_not_line_up_name_the_files(tmp_path, gold, pairs, message):
    task, root = _task_file(tmp_path, PASTE, {"gold.txt": gold})
    _zip(root / "toy", "pairs.zip", {"in/pairs.txt": pairs})
    with pytest.raises(TaskError, match=message):
        task.load_split("test", root)


def test_a_missing_zip_member_is_missing_data_naming_it(tmp_path):
    task, root = _task_file(tmp_path, PASTE, {"gold.txt": "1\n"})
    _zip(root / "toy", "pairs.zip", {"in/other.txt": "a\tb\n"})
    with pytest.raises(TaskDataMissing, match=r"looked for .*toy/pairs.zip/in/pairs.txt"):
        task.load_split("test", root)


@pytest.mark.parametrize(
    "entry,message",
    [
        ("{file: a.tsv, paste: [a.tsv, b.tsv]}", r"Toy.yaml: splits.train needs exactly one of `file` \(one file\) or `paste`"),
        ("{paste: [a.tsv]}", r"Toy.yaml: splits.train.paste must list two or more files, got \['a.tsv'\]"),
        (
            "[train.tsv, {file: b.tsv, slect: {a: 1}}]",
            r"Toy.yaml: unknown key splits.train\[1\].slect; valid keys under "
            r"splits.train\[1\]: file, paste, folder, fields, optional_fields, select$",
        ),
        ("[train.tsv, 3]", r"Toy.yaml: splits.train entries must be file names or mappings \(file/paste, ...\), got 3"),
    ],
)
def test_split_file_entry_mistakes_name_file_and_key(tmp_path, entry, message):
    with pytest.raises(TaskError, match=message):
        _task_file(tmp_path, TOY.replace("train: train.tsv,", f"train: {entry},"), {})


def test_select_keeps_matching_rows_and_drop_labels_and_label_before(tmp_path):
    body = (
        TOY.replace("train: train.tsv,", "train: {file: train.tsv, select: {source: keep}},")
        .replace(
            "data: {local: toy, format: tsv, header: true}",
            "data: {local: toy, format: tsv, header: true, drop_labels: [x_skip]}",
        )
        .replace("columns: {text: sentence, label: label}", "columns: {text: sentence, label: label, label_before: _}")
    )
    body = body.replace("labels: [0, 1]", "labels: infer")
    rows = "sentence\tlabel\tsource\na\tpos_1\tkeep\nb\tneg_2\tkeep\nc\tpos_3\tdrop\nd\tx_skip\tkeep\n"
    task, root = _task_file(tmp_path, body, {"train.tsv": rows, "dev.tsv": "sentence\tlabel\tsource\n"})
    split = task.load_split("train", root)
    assert split.texts == ["a", "b"] and task.label_mapping(root) == {"neg": 0, "pos": 1} and split.labels.tolist() == [1, 0]
    bad = body.replace("select: {source: keep}", "select: {sorce: keep}")
    (tmp_path / "Toy.yaml").write_text(bad)
    with pytest.raises(
        TaskError, match=r"train.tsv: select field 'sorce' is not a field of this file \(sentence, label, source\)"
    ):
        parse_task_file(tmp_path / "Toy.yaml").load_split("train", root)


BEIR = """
name: ToyRetrieval
family: retrieval
input: pair
target: score
metrics: [ndcg_at_10]
data: {local: toy, format: beir, corpus: corpus.jsonl, queries: queries.jsonl}
splits: {test: qrels.tsv}
columns: {text: query-id, text_pair: corpus-id, label: score}
train_split: null
eval_split: test
"""


def test_beir_qrels_naming_an_unknown_document_is_an_error_with_its_line(tmp_path):
    corpus = '{"_id": "d1", "title": "T", "text": "doc one"}\n'
    queries = '{"_id": "q1", "text": "query one"}\n{"_id": "q2", "text": "unjudged"}\n'
    task, root = _task_file(
        tmp_path, BEIR, {"corpus.jsonl": corpus, "queries.jsonl": queries, "qrels.tsv": "query-id\tcorpus-id\tscore\nq1\td1\t1\n"}
    )
    beir = task.load_beir("test", root)
    assert beir.queries == {"q1": "query one"} and beir.qrels == {"q1": {"d1": 1}} and beir.corpus == {"d1": ("T", "doc one")}
    assert task.load_split("test", root).texts_pair == ["T doc one"]
    (root / "toy" / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td9\t1\n")
    task, _ = parse_task_file(tmp_path / "Toy.yaml"), None
    with pytest.raises(TaskError, match=r"qrels.tsv:3: corpus-id 'd9' is not in .*toy/corpus.jsonl"):
        task.load_beir("test", root)
    with pytest.raises(TaskError, match=r"data.format beir needs data.corpus and data.queries"):
        _task_file(tmp_path / "other", BEIR.replace(", corpus: corpus.jsonl", ""), {})
