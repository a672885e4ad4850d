"""Does a frozen VLA's own embedding know where the named target is?

DSRL's noise actor needs an observation representation from which "which of the two
slots holds the named colour" can be read. The cheapest one would be the frozen base's:
``lite_vla``'s expert output at the state token (the input of its value head), computed
by every act anyway. This measures whether that embedding holds the answer, with probes
fitted on ``--train`` held-out reach_color states and scored on ``--test`` others:

* a linear probe (logistic regression) and a small MLP probe (one hidden layer of 64) on
  the base's embedding, for the base cloned as ``bench_vla_learning.py dsrl`` clones it
  (``--demo-count`` demos from the seed's own reset seeds, ``--updates`` updates) and for
  the same architecture before cloning (its pretrained vision and language weights);
* the same probes on the answer's own ingredients (the instruction's colour and the two
  slots' colours, one-hot): the control that shows the probes can learn the rule.

    python benchmarks/vla_base_probe.py --seed 1 --demo-count 100 --updates 300
"""

from __future__ import annotations

import argparse
import json
import time
import types
from pathlib import Path

import numpy as np
from bench_vla_learning import clone_lite_vla
from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"


def probe(x, y, n_train: int, hidden: int | None, seed: int) -> dict:
    """Train accuracy and test accuracy of a probe fitted on the first ``n_train`` rows."""
    import torch

    torch.manual_seed(seed)
    x = torch.as_tensor(x, dtype=torch.float32)
    y = torch.as_tensor(y, dtype=torch.float32)
    mu, sd = x[:n_train].mean(0), x[:n_train].std(0) + 1e-6
    x = (x - mu) / sd
    d = x.shape[1]
    net = torch.nn.Linear(d, 1) if hidden is None else torch.nn.Sequential(
        torch.nn.Linear(d, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))  # fmt: skip
    opt = torch.optim.Adam(net.parameters(), lr=1e-2 if hidden is None else 3e-3, weight_decay=1e-3)
    for _ in range(1000):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(net(x[:n_train]).squeeze(-1), y[:n_train])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        hit = ((net(x).squeeze(-1) > 0).float() == y).float()
    return {"train_acc": round(float(hit[:n_train].mean()), 3), "test_acc": round(float(hit[n_train:].mean()), 3)}


def embeddings(policy, obs, batch: int = 50) -> np.ndarray:
    import torch

    out = []
    with torch.no_grad():
        for i in range(0, len(obs["state"]), batch):
            sub = {"state": obs["state"][i : i + batch], "images": {"top": obs["images"]["top"][i : i + batch]},
                   "instruction": obs["instruction"][i : i + batch]}  # fmt: skip
            cache, pad, state = policy.prefix(sub)
            out.append(policy.model.state_features(cache, pad, state).float().numpy())
    return np.concatenate(out)


def main() -> None:
    import torch

    from rlinf_user.config.compose import compose_config
    from rlinf_user.env.spec import EnvSpec, obs_to_torch, stack_obs
    from rlinf_user.policies.base import build_policy
    from rlinf_user.sims.reach import COLORS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--demo-count", type=int, default=100)
    ap.add_argument("--updates", type=int, default=300)
    ap.add_argument("--train", type=int, default=1000)
    ap.add_argument("--test", type=int, default=300)
    ap.add_argument("--out", default=str(RESULTS / "vla_base_probe.json"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    t0 = time.time()
    clone_args = types.SimpleNamespace(vlm_layers=4, lr=3e-4, updates=args.updates, batch=32)
    cloned, env, spec, info = clone_lite_vla(args.demo_count, args.seed, 1000 * (args.seed + 1), clone_args)
    torch.manual_seed(args.seed)
    cfg = compose_config(["policy=lite_vla", "policy.vlm_layers=4"], sim="reach_color")
    pretrained = build_policy(cfg.policy, EnvSpec.of_env(env)).eval()

    names = sorted(COLORS)
    rows, labels, parts = [], [], []
    for s in range(50000, 50000 + args.train + args.test):  # held-out reset seeds (the bench's validation range)
        o, _ = env.reset(seed=s)
        u = env.unwrapped
        rows.append(o)
        labels.append(float(u.goal[1] > 0))  # the goal is the +y slot
        colour = o["instruction"].removeprefix("reach the ").removesuffix(" target")
        slots = sorted(u._targets, key=lambda p: p[1])
        slot_colours = [tuple(o["images"]["top"][tuple(int(v) for v in u._pixels(p))]) for p in slots]
        onehot = [float(colour == n) for n in names]
        for c in slot_colours:
            onehot += [float(c == COLORS[n]) for n in names]
        parts.append(onehot)
    obs = obs_to_torch(stack_obs(rows))
    pretrained.fit_normalizer(obs["state"][: args.train])
    y = np.asarray(labels)
    out = {"what": "probes for 'which slot holds the named target' on held-out reach_color states",
           "seed": args.seed, "clone": {"demos": args.demo_count, "updates": args.updates, **info},
           "states": {"train": args.train, "test": args.test}, "goal_on_plus_y": round(float(y.mean()), 3),
           "probes": {}}  # fmt: skip
    inputs = {"clone_embedding": embeddings(cloned, obs), "pretrained_embedding": embeddings(pretrained, obs),
              "control_colours_one_hot": np.asarray(parts, np.float32)}  # fmt: skip
    for name, x in inputs.items():
        out["probes"][name] = {"dims": int(x.shape[1]), "linear": probe(x, y, args.train, None, args.seed),
                               "mlp64": probe(x, y, args.train, 64, args.seed)}  # fmt: skip
        print(name, json.dumps(out["probes"][name]), flush=True)
    out["wall_s"] = round(time.time() - t0, 1)
    out["machine"] = describe()
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
