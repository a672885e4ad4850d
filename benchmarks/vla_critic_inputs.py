"""What can a critic learn about a VLA's noise from the rows DSRL would have? Inputs compared.

DSRL's critics ranked a state's noises at chance (``vla_dsrl_critic_rank.py``). This asks
whether that is the TD learning or the input: it fits classifiers of an episode's success,
supervised (the best a critic could do from the same rows), from what a critic could read:

* ``emb+u``: the base's embedding of the first observation and the noise (DSRL's critic);
* ``emb+chunk``: the embedding and the first chunk the base decodes from that noise (the
  action the noise stands for, DSRL-NA's action critic over chunks);
* ``emb+u+chunk``: both;
* ``emb+learned_chunk``: the embedding and a learned stand-in for the decoding,
  ``g(emb, u) -> chunk`` fit on the training draws (no VLA pass needed to compute it).

Data: ``--train-states`` training resets with ``--train-draws`` noises each (about the first
chunks of DSRL's 8,000 env steps at the default), every noise held for its episode in the
box ``noise_max`` (as ``vla_noise_reach.py --noise per_episode``); ``--test-states``
held-out validation states with ``--test-draws`` each. Scored per test state with both wins
and losses as the chance that a winning noise ranks above a losing one (AUC), and by how
often the top-ranked draw won, against the draws' own win rate there.

    python benchmarks/vla_critic_inputs.py <dsrl run dir> --out results/vla_critic_inputs_s1.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from chunk_episodes import report, run_side_by_side


def collect(steered, envs, spec, seeds, draws, box, rng):
    """Per draw: the embedding, the noise (unit box), the decoded first chunk, success."""
    import torch

    from rlinf_user.env.spec import obs_to_torch, stack_obs

    base = steered.base
    h, a = steered.noise_shape
    cols = {"emb": [], "u": [], "chunk": [], "won": [], "state": []}
    for s in seeds:
        obs = [e.reset(seed=int(s))[0] for e in envs[:draws]]
        u = rng.uniform(-1, 1, (draws, h, a)).astype(np.float32)
        first = obs_to_torch(stack_obs(obs[:1]))
        with torch.no_grad():
            emb = base.embed(first)[0].numpy()
            chunk0 = base.act_from_noise(obs_to_torch(stack_obs(obs)), torch.from_numpy(box * u)).numpy()

        def chunks(idx, live_obs, k, u=u):
            with torch.no_grad():
                return base.act_from_noise(obs_to_torch(stack_obs(live_obs)), torch.from_numpy(box * u[idx])).numpy()

        won = run_side_by_side(envs[:draws], spec, obs, chunks)
        for j in range(draws):
            cols["emb"].append(emb)
            cols["u"].append(u[j].ravel())
            cols["chunk"].append(chunk0[j].ravel())
            cols["won"].append(float(won[j]))
            cols["state"].append(int(s))
    return {k: np.asarray(v, np.float32 if k != "state" else np.int64) for k, v in cols.items()}


def fit_mlp(x, y, hidden, loss_fn, lr, seed, epochs, weight_decay=0.0):
    """A 2-layer MLP fitted by Adam on standardised ``x`` (minibatches of 128): returns the
    net and the standardisation ``(mean, std)`` it expects."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    mu, sd = x.mean(0), x.std(0) + 1e-6
    xt, yt = torch.from_numpy((x - mu) / sd), torch.from_numpy(y)
    out = yt.shape[1] if yt.dim() > 1 else 1
    net = nn.Sequential(nn.Linear(x.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out))
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(epochs):
        for b in torch.randperm(len(xt)).split(128):
            loss = loss_fn(net(xt[b]), yt[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return net, (mu, sd)


def _predict(net, norm, x):
    import torch

    with torch.no_grad():
        return net(torch.from_numpy((x - norm[0]) / norm[1])).numpy()


def fit_decoder(train, test, seed, epochs=300):
    """A learned stand-in for the base's decoding, ``g(emb, u) -> chunk``, fit on the training
    rows' (noise, decoded chunk) pairs: what a learner could compute without running the VLA.
    Adds ``g`` to both sets; returns its R^2 on the held-out draws."""
    ym, ys = train["chunk"].mean(0), train["chunk"].std(0) + 1e-6
    net, norm = fit_mlp(np.concatenate([train["emb"], train["u"]], 1), (train["chunk"] - ym) / ys, 512,
                        lambda p, y: ((p - y) ** 2).mean(), 1e-3, seed, epochs)  # fmt: skip
    for d in (train, test):
        d["g"] = _predict(net, norm, np.concatenate([d["emb"], d["u"]], 1)) * ys + ym
    resid = ((test["g"] - test["chunk"]) ** 2).sum()
    return round(float(1 - resid / ((test["chunk"] - test["chunk"].mean(0)) ** 2).sum()), 3)


def fit_and_score(train, test, keys, seed, epochs=300):
    import torch

    net, norm = fit_mlp(np.concatenate([train[k] for k in keys], 1), train["won"], 256,
                        lambda p, y: torch.nn.functional.binary_cross_entropy_with_logits(p[:, 0], y), 3e-4, seed,
                        epochs, weight_decay=1e-4)  # fmt: skip
    score = _predict(net, norm, np.concatenate([test[k] for k in keys], 1))[:, 0]
    aucs, top, rate = [], 0, []
    for s in np.unique(test["state"]):
        m = test["state"] == s
        q, w = score[m], test["won"][m] > 0.5
        if w.any() and (~w).any():
            aucs.append(float((q[w][:, None] > q[~w][None, :]).mean()))
            top += int(w[np.argmax(q)])
            rate.append(float(w.mean()))
    return {"auc_mean": round(float(np.mean(aucs)), 3), "states_scored": len(aucs), "top_ranked_won": top,
            "random_draw_win_rate_there": round(float(np.mean(rate)), 3)}  # fmt: skip


def main() -> None:
    import torch
    from omegaconf import OmegaConf

    from rlinf_user.env.registry import make_env
    from rlinf_user.env.spec import EnvSpec
    from rlinf_user.policies.base import build_policy
    from rlinf_user.seeds import episode_seed

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a DSRL run directory (its config names the base checkpoint)")
    ap.add_argument("--train-states", type=int, default=400)
    ap.add_argument("--train-draws", type=int, default=2)
    ap.add_argument("--test-states", type=int, default=30)
    ap.add_argument("--test-draws", type=int, default=32)
    ap.add_argument("--box", type=float, default=None, help="the noise box (default: the run's algo.noise_max)")
    ap.add_argument("--fits", type=int, default=3, help="classifier seeds per input")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", default=None, help="an .npz of collected draws to reuse (written when absent)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    cfg = OmegaConf.load(Path(args.run) / "config.yaml")
    box = float(args.box if args.box is not None else cfg.algo.noise_max)
    if args.data and Path(args.data).exists():
        z = np.load(args.data)
        train = {k[6:]: z[k] for k in z.files if k.startswith("train_")}
        test = {k[5:]: z[k] for k in z.files if k.startswith("test_")}
    else:
        envs = [make_env(cfg.env, seed=i) for i in range(max(args.train_draws, args.test_draws))]
        spec = EnvSpec.of_env(envs[0])
        steered = build_policy(cfg.policy, spec).eval()
        rng = np.random.default_rng(0)
        train = collect(steered, envs, spec, range(args.train_states), args.train_draws, box, rng)
        s0 = episode_seed("validation")
        test = collect(steered, envs, spec, range(s0, s0 + args.test_states), args.test_draws, box, rng)
        if args.data:
            np.savez(args.data, **{f"train_{k}": v for k, v in train.items()}, **{f"test_{k}": v for k, v in test.items()})
    collected_s = round(time.time() - t0, 1)
    inputs = {"emb+u": ["emb", "u"], "emb+chunk": ["emb", "chunk"], "emb+u+chunk": ["emb", "u", "chunk"],
              "emb+learned_chunk": ["emb", "g"]}
    results = {"decoder_r2_held_out": fit_decoder(train, test, 0)}
    print("decoder R^2", results["decoder_r2_held_out"], flush=True)
    for name, keys in inputs.items():
        fits = [fit_and_score(train, test, keys, seed) for seed in range(args.fits)]
        results[name] = {"auc_per_fit": [f["auc_mean"] for f in fits],
                         "top_ranked_won_per_fit": [f["top_ranked_won"] for f in fits],
                         "states_scored": fits[0]["states_scored"],
                         "random_draw_win_rate_there": fits[0]["random_draw_win_rate_there"]}  # fmt: skip
        print(name, json.dumps(results[name]), flush=True)
    out = {"what": "supervised success classifiers from a critic's possible inputs: per-state AUC on held-out states",
           "run": Path(args.run).name, "base_checkpoint": Path(str(cfg.policy.get("base_checkpoint"))).name,
           "noise_box": box, "noise": "per_episode", "train_states": args.train_states, "train_draws": args.train_draws,
           "train_success_rate": round(float(train["won"].mean()), 3), "test_states": args.test_states,
           "test_draws": args.test_draws, "inputs": results, "collect_s": collected_s,
           "wall_s": round(time.time() - t0, 1), "machine": f"2 vCPUs, no GPU; {args.threads} torch thread(s)"}  # fmt: skip
    report(out, args.out, detail="none")


if __name__ == "__main__":
    main()
