"""``rlinf-user train-reward DATASET... --out PATH``: a success classifier for ``reward.classifier``."""

from __future__ import annotations

from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table


def run_train_reward(args, console) -> int:
    from omegaconf import OmegaConf

    from rlinf_user.policies.gaussian import GaussianPolicyConfig
    from rlinf_user.reward.classifier import load_frames, train_classifier

    frames = load_frames(args.datasets, last_frames=args.last_frames)
    encoder = OmegaConf.to_container(OmegaConf.structured(GaussianPolicyConfig))
    encoder["name"] = args.encoder or ("cnn" if frames.images else "mlp")
    console.print(
        f"{len(frames.label)} frames from {len(set(frames.episode.tolist()))} episodes: "
        f"{int(frames.label.sum())} labelled success; encoder {encoder['name']}"
    )
    with Progress(TextColumn("training"), BarColumn(), TextColumn("{task.completed}/{task.total} loss {task.fields[loss]:.3f}"),
                  TimeRemainingColumn(), console=console, transient=True) as bar:  # fmt: skip
        task = bar.add_task("train", total=args.steps, loss=float("nan"))
        model, metrics = train_classifier(
            frames, encoder, steps=args.steps, threshold=args.threshold, val_fraction=args.val_fraction, seed=args.seed,
            on_step=lambda i, loss: bar.update(task, completed=i + 1, loss=loss),
        )  # fmt: skip
    out = Path(args.out)
    model.save(
        out, args.threshold, {**metrics, "datasets": [str(d) for d in args.datasets], "last_frames": args.last_frames}
    )
    table = Table(title=f"success classifier -> {out}")
    for col in ("split", "frames (success / other)", "true positive rate", "true negative rate"):
        table.add_column(col)
    for name in ("train", "validation"):
        m = metrics.get(name)
        if m:
            table.add_row(
                name,
                f"{m['positives']} / {m['negatives']}",
                f"{m['true_positive_rate']:.3f}",
                f"{m['true_negative_rate']:.3f}",
            )
    console.print(table)
    console.print(f"use it with `rlinf-user train ... reward.classifier={out}`")
    return 0
