"""prepare_data's steps in order: read -> scrub PII -> dedup -> difficulty -> held-out splits -> mix -> write.

Every setting is checked before the first file is read. Scrubbing runs on each row's id, question and
reference before anything else sees them, so nothing unscrubbed reaches the dataset or the report.
The golden and eval splits are drawn per category in proportion (seeded); then any training row whose
exact n-gram Jaccard with a held-out row reaches the dedup threshold is dropped (and any eval row near
a golden one), so no held-out question has a near duplicate in training even where LSH missed a pair.
The difficulty mix then samples the training split. The dataset and its report are built in a
temporary directory next to the destination and moved into place, so a failed run leaves nothing; what a
run killed while replacing OUT/NAME left (the old dataset renamed aside) the next run restores (`recover`).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rubric_jax.files import PathError, check_input_file, write_atomic
from rubric_jax.prepare import convert, dedup, mix, pii, report as report_md, tfds_dataset
from rubric_jax.prepare.convert import SourceRow

SPLITS = ("train", "eval", "golden")
MAX_NUM_PERM = 1024  # --config.dedup.num_perm: LSH gains nothing past a few hundred hash functions; 1e9 grew to 7 GB
_SCRUBBED_FIELDS = ("id", "question", "reference")


class PrepareError(ValueError):
    """A setting or input prepare_data cannot use; the message says which and why."""


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
    """The settings of one prepare_data run (its flags and configs/commands/prepare_data.py)."""

    inputs: tuple[str, ...]  # KIND:PATH, KIND in convert.INPUT_KINDS
    out: Path  # tfds data directory; the dataset goes to OUT/NAME/1.0.0, the report to OUT/NAME/
    name: str  # tfds dataset name (read as tfds:NAME)
    eval_size: int = 0  # held-out eval questions (0: no eval split)
    golden_size: int = 0  # golden questions (0: no golden split)
    train_size: int = 0  # training questions after the mix; 0: as many as the ratio allows (all without one)
    difficulty_ratio: str = "3:5:2"  # easy:medium:hard of the training split, or "none" (RubricRL §5.1)
    scores: Path | None = None  # jsonl with id and reward per row (experiments.score output): labels by tercile
    dedup_threshold: float = 0.7  # n-gram Jaccard at which two questions are duplicates
    ngram: int = 3  # character n-gram size
    num_perm: int = 128  # MinHash signature length
    semantic_words: float = 0.7  # content-word Jaccard at which two questions mean the same (dedup.py; 0 = off)
    semantic_model: str = ""  # HF model directory whose mean-pooled embeddings also mark duplicates ("" = none)
    semantic_tokenizer: str = ""  # its tokenizer directory ("" = the model directory)
    semantic_cosine: float = 0.95  # embedding cosine at which two questions mean the same (with semantic_model)
    seed: int = 0  # MinHash functions, split and mix sampling
    overwrite: bool = False  # replace an existing OUT/NAME


def _check_settings(config: PrepareConfig, log: Callable[[str], None]
                    ) -> tuple[list[tuple[str, Path]], dict[str, float] | None]:
    """Parsed inputs and ratio; every value and path checked before any work (what a killed run left in
    OUT is healed first, see `recover`)."""
    if not config.inputs:
        raise PrepareError("no --input given (KIND:PATH, KIND one of " + ", ".join(convert.INPUT_KINDS) + ")")
    inputs = [convert.parse_input_spec(spec) for spec in config.inputs]
    try:
        ratio = None if config.difficulty_ratio == "none" else mix.parse_ratio(config.difficulty_ratio)
    except mix.MixError as e:
        raise PrepareError(f"--config.difficulty_ratio: {e}") from None
    if not tfds_dataset.NAME_RE.fullmatch(config.name):
        raise PrepareError(f"--name={config.name}: expected lower-case letters, digits and '_', starting with a letter")
    for flag in ("eval_size", "golden_size", "train_size"):
        if getattr(config, flag) < 0:
            raise PrepareError(f"--{flag}={getattr(config, flag)}: expected a non-negative integer")
    if not 0.0 < config.dedup_threshold <= 1.0:
        raise PrepareError(f"--config.dedup.threshold={config.dedup_threshold}: expected a number in (0, 1]")
    if not 0.0 <= config.semantic_words <= 1.0:
        raise PrepareError(f"--config.dedup.semantic_words={config.semantic_words}: expected a number in [0, 1] "
                           "(0 = off)")
    if not -1.0 <= config.semantic_cosine <= 1.0:
        raise PrepareError(f"--config.dedup.semantic_cosine={config.semantic_cosine}: expected a cosine in [-1, 1]")
    for flag in ("semantic_model", "semantic_tokenizer"):
        if getattr(config, flag) and not Path(getattr(config, flag)).is_dir():
            raise PrepareError(f"--{flag}={getattr(config, flag)}: directory does not exist")
    if config.ngram < 1 or config.num_perm < 1:
        raise PrepareError(f"--config.dedup.ngram={config.ngram} and --config.dedup.num_perm={config.num_perm} "
                           "must be >= 1")
    if config.num_perm > MAX_NUM_PERM:  # the signatures take num_perm x 8 bytes per question
        raise PrepareError(f"--config.dedup.num_perm={config.num_perm}: at most {MAX_NUM_PERM} (MinHash signatures of "
                           f"{config.num_perm} x 8 bytes per question); 128 is the default")
    if config.seed < 0:
        raise PrepareError(f"--config.seed={config.seed}: expected a non-negative integer")
    if config.scores is not None:
        try:
            check_input_file(config.scores, "scores")
        except PathError as e:
            raise PrepareError(f"--scores={config.scores}: {e}") from None
    if config.out.exists() and not config.out.is_dir():
        raise PrepareError(f"--out={config.out}: exists and is not a directory")
    dest = (config.out / config.name).resolve()
    for path in [p for _, p in inputs] + ([config.scores] if config.scores else []):
        src = path.resolve()
        if src == dest or dest in src.parents or src in dest.parents:
            raise PrepareError(f"--out={config.out} with --name={config.name}: the output {dest} would overlap "
                               f"the input {path}")
    recover(config.out, config.name, log)
    if dest.exists() and not config.overwrite:
        raise PrepareError(f"{dest} already exists; pass --config.overwrite to replace it")
    return inputs, ratio


def _read(inputs: Sequence[tuple[str, Path]], log: Callable[[str], None]) -> tuple[list[SourceRow], list[dict]]:
    rows: list[SourceRow] = []
    notes = []
    first_seen: dict[str, str] = {}
    for kind, path in inputs:
        read, note = convert.read_input(kind, path)
        for r in read:
            if r.row["id"] in first_seen:
                raise PrepareError(f"{r.where}: duplicate id {r.row['id']!r} (first seen at {first_seen[r.row['id']]})")
            first_seen[r.row["id"]] = r.where
        rows.extend(read)
        notes.append({"input": f"{kind}:{path}", "rows": len(read), **note})
        log(f"read {len(read)} rows from {kind}:{path}")
        if note.get("lang_guessed"):
            log(f"{kind}:{path}: {sum(note['lang_guessed'].values())} rows have no 'lang'; guessed from the script of "
                f"their question: {note['lang_guessed']}")
    return rows, notes


def _scrub(rows: Sequence[SourceRow]) -> tuple[list[SourceRow], dict[str, Any], dict[str, str]]:
    """Rows with PII replaced in their id, question and reference, the counts per kind and field, and the
    ids that changed ({old: new}; a scrubbed id gets '~<row number>' so two ids cannot become one)."""
    by_field = {field: collections.Counter() for field in _SCRUBBED_FIELDS}
    changed = 0
    out = []
    renamed = {}
    for number, r in enumerate(rows):
        row = dict(r.row)
        for field in _SCRUBBED_FIELDS:
            if field in row:
                try:
                    row[field], counts = pii.scrub_pii(row[field])
                except pii.PiiError as e:
                    raise PrepareError(f"{r.where}: field {field!r}: {e}") from None
                by_field[field].update(counts)
        if row["id"] != r.row["id"]:
            row["id"] = renamed[r.row["id"]] = f"{row['id']}~{number}"
        changed += row != r.row
        out.append(SourceRow(row, r.where, r.kind))
    total = sum(by_field.values(), collections.Counter())
    return out, {"rows_changed": changed, "by_kind": {k: total.get(k, 0) for k in pii.PII_KINDS},
                 "by_field": {f: dict(sorted(c.items())) for f, c in by_field.items()}}, renamed


def _label(rows: list[SourceRow], scores: Path | None, input_ids: set[str], renamed: dict[str, str]
           ) -> tuple[list[SourceRow], dict[str, Any]]:
    """Rows with difficulty labels from the scores file where it has them (given labels otherwise).

    Terciles are taken over the rows left after dedup; scores of removed duplicates are ignored and
    scores of ids that no input has are counted (and listed scrubbed). The scores name the ids as read;
    `renamed` maps the ones PII scrubbing changed.
    """
    info: dict[str, Any] = {"source": "labels"}
    if scores is not None:
        means, stats = convert.read_mean_rewards(scores)
        unknown = sorted(set(means) - input_ids)
        means = {renamed.get(qid, qid): m for qid, m in means.items()}
        ids = {r.row["id"] for r in rows}
        labels = mix.difficulty_from_rewards({qid: m for qid, m in means.items() if qid in ids})
        relabelled = sum(1 for r in rows if r.row["id"] in labels and r.row.get("difficulty") not in
                         (None, labels[r.row["id"]]))
        rows = [SourceRow({**r.row, "difficulty": labels[r.row["id"]]}, r.where, r.kind) if r.row["id"] in labels else r
                for r in rows]
        info = {"source": f"scores ({scores}), terciles of mean reward", **stats, "scored_questions": len(labels),
                "unscored_questions": len(ids) - len(labels), "given_labels_replaced": relabelled,
                "score_ids_not_in_input": len(unknown),
                "score_ids_not_in_input_first": [pii.scrub_pii(qid)[0] for qid in unknown[:5]]}
    info["counts"] = dict(collections.Counter(r.row.get("difficulty") or "unlabelled" for r in rows))
    return rows, info


def _semantic_dedup(rows: list[SourceRow], config: PrepareConfig, log: Callable[[str], None]
                    ) -> tuple[list[SourceRow], dict[str, Any]]:
    """Rows left after the semantic step (dedup.semantic_duplicates: content words, and embeddings of
    `semantic_model` when given), and its report entry."""
    questions = [r.row["question"] for r in rows]
    embeddings = None
    if config.semantic_model:
        from rubric_jax.prepare.embedding import embed, load_embedder  # JAX loads only when a model is given

        embedder = load_embedder(config.semantic_model, config.semantic_tokenizer or None, seed=config.seed)
        embeddings = embed(embedder, questions)
    kept, pairs = dedup.semantic_duplicates(questions, config.semantic_words, embeddings, config.semantic_cosine)
    log(f"semantic dedup: {len(pairs)} removed ({sum(p.signal == 'words' for p in pairs)} by content words), "
        f"{len(kept)} rows left")
    info = {"in": len(rows), "words_threshold": config.semantic_words, "model": config.semantic_model or None,
            "cosine_threshold": config.semantic_cosine if config.semantic_model else None,
            "pairs": [{"kept_id": rows[p.kept].row["id"], "removed_id": rows[p.removed].row["id"], "signal": p.signal,
                       "word_jaccard": round(p.word_jaccard, 4),
                       "cosine": None if p.cosine is None else round(p.cosine, 4)} for p in pairs]}
    return [rows[i] for i in kept], info


def _held_out(rows: list[SourceRow], config: PrepareConfig) -> tuple[dict[str, list[SourceRow]], list[dict]]:
    """golden, eval and (unmixed) train splits with no held-out question near a training one."""
    if config.golden_size + config.eval_size >= len(rows):
        raise PrepareError(f"--config.golden_size={config.golden_size} and --config.eval_size={config.eval_size} "
                           "leave no training "
                           f"rows: {len(rows)} questions are left after dedup")
    categories = [r.row["category"] for r in rows]
    golden_at = set(mix.stratified_sample(categories, config.golden_size, config.seed))
    rest = [i for i in range(len(rows)) if i not in golden_at]
    eval_at = {rest[k] for k in mix.stratified_sample([categories[i] for i in rest], config.eval_size, config.seed + 1)}
    splits = {"golden": [rows[i] for i in sorted(golden_at)], "eval": [rows[i] for i in sorted(eval_at)],
              "train": [rows[i] for i in range(len(rows)) if i not in golden_at and i not in eval_at]}
    leaks = []
    for held_names, split in ((("golden",), "eval"), (("golden", "eval"), "train")):
        held = [r for name in held_names for r in splits[name]]
        pairs = dedup.cross_duplicates([r.row["question"] for r in held], [r.row["question"] for r in splits[split]],
                                       config.dedup_threshold, config.ngram)
        drop = {c for _, c, _ in pairs}
        leaks += [{"held_out_id": held[q].row["id"], "dropped_id": splits[split][c].row["id"], "dropped_from": split,
                   "jaccard": round(j, 4)} for q, c, j in pairs]
        splits[split] = [r for c, r in enumerate(splits[split]) if c not in drop]
    return splits, leaks


def _mix(train: list[SourceRow], ratio: dict[str, float] | None, config: PrepareConfig, log: Callable[[str], None]
         ) -> tuple[list[SourceRow], dict[str, Any]]:
    """The training rows kept by the difficulty mix (or a category-stratified sample without a ratio).

    A level the ratio asks for with no training rows at all is refused (one difficulty among the questions
    kept 1 of 8 at 3:5:2, silently): the ratio cannot be met, and filling from other levels would not be
    that ratio. What the mix keeps and drops per level is logged in one line.
    """
    if ratio is None:
        if not config.train_size:
            return train, {"ratio": None}
        if config.train_size > len(train):
            raise PrepareError(f"--config.train_size={config.train_size}: only {len(train)} training rows are left")
        keep = mix.stratified_sample([r.row["category"] for r in train], config.train_size, config.seed + 2)
        return [train[i] for i in keep], {"ratio": None}
    labels = [r.row.get("difficulty") for r in train]
    bad = [(r, d) for r, d in zip(train, labels) if d not in ratio]
    if bad:
        r, d = bad[0]
        raise PrepareError(f"{len(bad)} training rows have no difficulty in {list(ratio)} (first: {r.where}, id "
                           f"{r.row['id']!r}, difficulty {d!r}); label them, pass --scores=FILE, or "
                           f"--config.difficulty_ratio=none")
    pools = collections.Counter(labels)
    fit = mix.max_mix_size(pools, ratio)
    absent = [d for d, weight in ratio.items() if weight > 0 and not pools[d]]
    if absent:
        raise PrepareError(f"--config.difficulty_ratio={config.difficulty_ratio}: the training split has no "
                           f"{' or '.join(absent)} rows ({dict(pools)}), so the mix would keep {fit} of {len(train)}; "
                           "label the difficulties, pass --scores=FILE, or --config.difficulty_ratio=none to keep "
                           "every row")
    size = config.train_size or fit
    if size > fit:
        raise PrepareError(f"--config.train_size={size}: at {config.difficulty_ratio} the training pool "
                           f"{dict(pools)} supplies at most {fit} rows")
    keep = sorted(mix.difficulty_mix(labels, size, config.seed + 2, ratio))
    kept = [train[i] for i in keep]
    achieved = collections.Counter(r.row["difficulty"] for r in kept)
    log(f"difficulty mix {config.difficulty_ratio}: kept {len(kept)} of {len(train)} training rows ("
        + ", ".join(f"{d} {achieved[d]}/{pools[d]}" for d in ratio) + f"), dropped {len(train) - len(kept)}"
        + (" to meet the ratio" if len(kept) < len(train) else ""))
    return kept, {"ratio": ratio, "pool": dict(pools), "target": mix.largest_remainder(size, ratio),
                  "achieved": dict(achieved), "dropped": len(train) - len(kept)}


def _coverage(splits: dict[str, list[SourceRow]], all_rows: list[SourceRow]) -> dict[str, Any]:
    def counts(rows: list[SourceRow], key: Callable[[dict], str]) -> dict[str, int]:
        return dict(sorted(collections.Counter(key(r.row) for r in rows).items()))

    out: dict[str, Any] = {name: {"rows": len(rows), "category": counts(rows, lambda r: r["category"]),
                                  "lang": counts(rows, lambda r: r["lang"]),
                                  "difficulty": counts(rows, lambda r: r.get("difficulty") or "unlabelled"),
                                  "input_kind": dict(sorted(collections.Counter(r.kind for r in rows).items()))}
                           for name, rows in splits.items()}
    out["categories_missing_from_train"] = sorted({r.row["category"] for r in all_rows}
                                                  - {r.row["category"] for r in splits["train"]})
    return out


def _pid_alive(pid: int) -> bool:
    """True when a process `pid` exists (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _leftovers(out: Path, name: str) -> tuple[list[Path], list[Path]]:
    """The `.NAME.old-PID` and `.NAME.tmp-PID-*` directories in `out` whose process is gone (a killed run)."""
    found: tuple[list[Path], list[Path]] = ([], [])
    if not out.is_dir():
        return found
    for path in sorted(out.iterdir()):
        match = re.fullmatch(rf"\.{re.escape(name)}\.(old|tmp)-(\d+)(?:-.*)?", path.name)
        if match and path.is_dir() and not _pid_alive(int(match.group(2))):
            found[match.group(1) == "tmp"].append(path)
    return found


def recover(out: Path, name: str, log: Callable[[str], None]) -> None:
    """Heals what a run killed inside `_publish` left: OUT/NAME missing beside its `.NAME.old-PID` (killed between
    the two renames) is renamed back; an old copy beside a present OUT/NAME (killed before deleting it) and
    unfinished `.NAME.tmp-*` builds are deleted. Each action is one line through `log`."""
    old, tmp = _leftovers(out, name)
    dest = out / name
    if old and not dest.exists():
        restored = max(old, key=lambda p: p.stat().st_mtime_ns)  # the most recently replaced one
        old.remove(restored)
        os.replace(restored, dest)
        log(f"restored {dest} from {restored.name}, left by a prepare_data --config.overwrite killed while "
            "replacing it")
    for path in old + tmp:
        shutil.rmtree(path)
        log(f"removed {path}, left by a killed prepare_data run")


def _publish(built: Path, dest: Path, overwrite: bool) -> None:
    """Moves the finished OUT/.tmp/NAME into OUT/NAME. With --config.overwrite the old one is renamed to
    `.NAME.old-PID` first and deleted after; a kill in between leaves it for `recover` to restore."""
    old = None
    if dest.exists():
        if not overwrite:
            raise PrepareError(f"{dest} already exists; pass --config.overwrite to replace it")
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        os.replace(dest, old)
    try:
        os.replace(built, dest)
    except BaseException:
        if old is not None:
            os.replace(old, dest)
        raise
    if old is not None:
        shutil.rmtree(old)


def prepare(config: PrepareConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Runs every step and writes OUT/NAME (tfds dataset, report.json, report.md); returns the report."""
    inputs, ratio = _check_settings(config, log)
    rows, input_notes = _read(inputs, log)
    steps = [{"step": "read", "in": len(rows), "out": len(rows)}]

    input_ids = {r.row["id"] for r in rows}
    rows, pii_info, renamed = _scrub(rows)
    steps.append({"step": "scrub PII", "in": len(rows), "out": len(rows), "rows_changed": pii_info["rows_changed"]})
    log(f"PII: {pii_info['rows_changed']} rows changed, {sum(pii_info['by_kind'].values())} replacements")

    kept, pairs = dedup.find_duplicates([r.row["question"] for r in rows], config.dedup_threshold, config.ngram,
                                        config.num_perm, config.seed)
    bands, band_rows = dedup.lsh_bands(config.num_perm, config.dedup_threshold)
    dedup_info = {"threshold": config.dedup_threshold, "ngram": config.ngram, "num_perm": config.num_perm,
                  "lsh_bands": bands, "lsh_rows": band_rows, "seed": config.seed,
                  "exact_removed": sum(p.kind == "exact" for p in pairs),
                  "near_removed": sum(p.kind == "near" for p in pairs),
                  "pairs": [{"kept_id": rows[p.kept].row["id"], "removed_id": rows[p.removed].row["id"], "kind": p.kind,
                             "jaccard": round(p.jaccard, 4), "jaccard_estimate": round(p.jaccard_estimate, 4)}
                            for p in pairs]}
    steps.append({"step": "dedup", "in": len(rows), "out": len(kept)})
    rows = [rows[i] for i in kept]
    log(f"dedup: {len(pairs)} duplicates removed ({dedup_info['exact_removed']} exact), {len(rows)} rows left")

    rows, semantic_info = _semantic_dedup(rows, config, log)
    steps.append({"step": "semantic dedup", "in": semantic_info["in"], "out": len(rows)})
    dedup_info["semantic"] = semantic_info

    rows, difficulty_info = _label(rows, config.scores, input_ids, renamed)
    splits, leaks = _held_out(rows, config)
    steps.append({"step": "held-out splits", "in": len(rows), "out": sum(len(s) for s in splits.values()),
                  "golden": len(splits["golden"]), "eval": len(splits["eval"]), "leaks_removed": len(leaks)})
    train_in = len(splits["train"])
    splits["train"], mix_info = _mix(splits["train"], ratio, config, log)
    steps.append({"step": "difficulty mix (train)", "in": train_in, "out": len(splits["train"])})
    log(f"splits: train {len(splits['train'])}, eval {len(splits['eval'])}, golden {len(splits['golden'])}")
    if not splits["train"]:
        raise PrepareError("no training rows are left after the held-out splits and the mix")

    report = {"name": config.name, "version": tfds_dataset.VERSION, "out": str(config.out),
              "settings": {k: str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v
                           for k, v in dataclasses.asdict(config).items()},
              "inputs": input_notes, "steps": steps, "pii": pii_info, "dedup": dedup_info,
              "difficulty": difficulty_info, "mix": mix_info, "held_out_leaks": leaks,
              "splits": {name: len(splits[name]) for name in SPLITS},
              "coverage": _coverage(splits, rows)}
    config.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{config.name}.tmp-{os.getpid()}-", dir=config.out))
    try:
        records = {name: [tfds_dataset.to_record(i, r.row, r.where) for i, r in enumerate(splits[name])]
                   for name in SPLITS}
        tfds_dataset.write_dataset(tmp, config.name, records)
        write_atomic(tmp / config.name / "report.json", json.dumps(report, ensure_ascii=False, indent=2) + "\n")
        write_atomic(tmp / config.name / "report.md", report_md.render(report))
        _publish(tmp / config.name, config.out / config.name, config.overwrite)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"wrote {config.out / config.name} (read it as tfds:{config.name} with data.tfds_dir={config.out})")
    return report
