"""Where a DSRL run over a VLA on reach_color ends its episodes: the clone (zero noise) and
the kept steered policy on N held-out states, each episode counted as a success, the other
target, or elsewhere, with the mean chosen noise split by which slot holds the named target.

    python benchmarks/vla_dsrl_outcomes.py <run dir> 50 best test

(the clone-test and outcome fields of results/vla_dsrl100_reach_color_s*.json; those runs
steered the model's full 4 x 7 noise, so their checkpoints are refused as not fitting by the
code since DSRL steers the env's 4 x 3 dims only)"""
import json
import sys

import numpy as np
import torch
from omegaconf import OmegaConf

from rlinf_user.env.registry import make_env
from rlinf_user.env.spec import EnvSpec, obs_to_torch, stack_obs
from rlinf_user.evaluation import load_policy_from_checkpoint
from rlinf_user.seeds import episode_seed


def main() -> None:
    torch.set_num_threads(2)
    run, n = sys.argv[1], int(sys.argv[2])
    cfg = OmegaConf.load(f"{run}/config.yaml")
    env = make_env(cfg.env, seed=0)
    spec = EnvSpec.of_env(env)
    pol, v = load_policy_from_checkpoint(f"{run}/checkpoints/best.pt" if len(sys.argv) < 4 or sys.argv[3] == "best" else sys.argv[3], cfg, spec)
    u = env.unwrapped
    s0 = episode_seed(sys.argv[4] if len(sys.argv) > 4 else "validation")
    def run_ep(seed, zero):
        o, _ = env.reset(seed=seed)
        slot = int(u._goal[1] > 0)
        other = u._targets[1].copy()
        noises = []
        done = False
        info = {}
        while not done:
            with torch.no_grad():
                obs = obs_to_torch(stack_obs([o]))
                if zero:
                    out = pol.base.act(obs, deterministic=True) if hasattr(pol, "base") else pol.act(obs, deterministic=True)
                else:
                    out = pol.act(obs, deterministic=True)
                    noises.append(out.extras["noise"][0].numpy())
            for a in out.actions[0].numpy():
                o, _, term, trunc, info = env.step(spec.expand_action(a))
                done = term or trunc
                if done:
                    break
        d_goal = np.linalg.norm(u.tcp - u._goal)
        d_other = np.linalg.norm(u.tcp - other)
        kind = "success" if info.get("success") else ("wrong" if d_other < d_goal else "elsewhere")
        return kind, slot, (np.mean(noises, 0) if noises else None)
    for zero in (True, False):
        res = [run_ep(s0 + i, zero) for i in range(n)]
        kinds = {k: sum(r[0] == k for r in res) for k in ("success", "wrong", "elsewhere")}
        line = {"policy": "clone (zero noise)" if zero else f"steered v{v}", **kinds}
        if not zero:
            for sl in (0, 1):
                ns = [r[2] for r in res if r[1] == sl]
                if ns:
                    line[f"noise_mean_goal_slot{sl}"] = np.round(np.mean(ns, 0), 2).tolist()
            line["by_slot"] = {sl: {k: sum(r[0] == k and r[1] == sl for r in res) for k in ("success", "wrong", "elsewhere")} for sl in (0, 1)}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
