"""Does a trained DSRL critic rank the noises that win above the ones that lose?

For each of ``--states`` held-out states this runs ``--draws`` episodes side by side: the
first chunk from a noise drawn uniformly in the unit box (``u``; the base gets
``noise_max * u``; ``--draw-from actor``: sampled from the trained actor at that state, the
spread the critic was trained on), every later chunk from the trained noise actor (its mean), exactly the
return the critic's ``Q(s0, u)`` estimates. Each draw is then scored by the critics (their
minimum, as the actor's loss reads them) at the state it started from, and compared with
how its episode ended:

* ``auc``: over the states with both wins and losses, the chance that a winning draw has the
  higher Q than a losing one (0.5: the critic tells them apart no better than a coin);
* ``top_q_won``: the states where the draw the critic ranks first won, against the draws'
  own win rate on those states (what picking a draw at random gives);
* ``actor``: the actor's own first noise, scored and run the same way.

    python benchmarks/vla_dsrl_critic_rank.py <dsrl run dir> --checkpoint ckpt-000008000.pt
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from chunk_episodes import report, run_side_by_side


def main() -> None:
    import torch
    from omegaconf import OmegaConf

    from rlinf_user.algorithms.base import build_algorithm
    from rlinf_user.env.registry import make_env
    from rlinf_user.env.spec import Col, EnvSpec, obs_to_torch, stack_obs
    from rlinf_user.seeds import episode_seed

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--checkpoint", default="ckpt-000008000.pt")
    ap.add_argument("--states", type=int, default=30)
    ap.add_argument("--draws", type=int, default=32)
    ap.add_argument("--split", default="validation")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draw-from", choices=["box", "actor"], default="box",
                    help="first-chunk noises uniform in the unit box, or sampled from the trained actor at the state "
                         "(the spread the critic was trained on)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    run = Path(args.run)
    cfg = OmegaConf.load(run / "config.yaml")
    n = args.draws + 1  # the last one: the actor's own first noise
    envs = [make_env(cfg.env, seed=i) for i in range(n)]
    spec = EnvSpec.of_env(envs[0])
    algo = build_algorithm(cfg.algo, cfg.policy, spec)
    state = torch.load(run / "checkpoints" / args.checkpoint, map_location="cpu", weights_only=False)
    algo.load_checkpoint_state(state["agent"])
    policy = algo.policy.eval()
    rng = np.random.default_rng(0)
    s0 = episode_seed(args.split)
    rows = []
    for i in range(args.states):
        obs = [e.reset(seed=s0 + i)[0] for e in envs]
        with torch.no_grad():
            o = obs_to_torch(stack_obs(obs[:1]))
            if policy.reads_embedding:
                o = {**o, Col.EMBEDDING: policy.base.embed(o)}
            actor_u = torch.tanh(policy.actor(policy.encoder(o))[0])[0].numpy()
            if args.draw_from == "actor":
                feats_a = policy.encoder(o).expand(n, -1)
                u = policy.actor.sample(feats_a)[0].numpy().astype(np.float32)
            else:
                u = rng.uniform(-1, 1, (n, policy.noise_dim)).astype(np.float32)
            u[-1] = actor_u
            feats = algo.critic_encoder({k: (v.expand(n, *v.shape[1:]) if torch.is_tensor(v) else list(v) * n)
                                         for k, v in o.items() if k != Col.IMAGES} | {Col.IMAGES: {}})  # fmt: skip
            q = algo.critic(feats, torch.from_numpy(u)).min(dim=0).values.numpy()
        def chunks(idx, live_obs, k, u=u):
            batch = obs_to_torch(stack_obs(live_obs))
            with torch.no_grad():
                if k == 0:  # the drawn noise, then the actor's
                    return policy.actions_for(batch, torch.from_numpy(u[idx])).numpy()
                return policy.act(batch, deterministic=True).actions.numpy()

        won = run_side_by_side(envs, spec, obs, chunks)
        rows.append({"q": q.round(3).tolist(), "won": won.astype(int).tolist()})
        d = won[:-1]
        print(json.dumps({"state": i, "draws_won": int(d.sum()), "top_q_won": bool(d[np.argmax(q[:-1])]),
                          "actor_won": bool(won[-1]), "actor_q_rank": int((q[:-1] > q[-1]).sum())}), flush=True)  # fmt: skip
    aucs, top, base_rate, mixed = [], 0, [], 0
    for r in rows:
        q, w = np.asarray(r["q"][:-1]), np.asarray(r["won"][:-1], bool)
        if w.any() and (~w).any():
            mixed += 1
            wins, losses = q[w][:, None], q[~w][None, :]
            aucs.append(float((wins > losses).mean() + 0.5 * (wins == losses).mean()))
            top += int(w[np.argmax(q)])
            base_rate.append(float(w.mean()))
    out = {"what": "the trained DSRL critic's Q(s0, u) for random first-chunk noises vs how their episodes ended "
                   "(the actor's noise after the first chunk)",
           "run": run.name, "checkpoint": args.checkpoint, "draw_from": args.draw_from, "states": args.states, "draws": args.draws,
           "states_with_wins_and_losses": mixed,
           "auc_mean": round(float(np.mean(aucs)), 3) if aucs else None,
           "top_q_won": top, "top_q_won_rate": round(top / mixed, 3) if mixed else None,
           "random_draw_win_rate_there": round(float(np.mean(base_rate)), 3) if base_rate else None,
           "draws_won_overall": round(float(np.mean([np.mean(r["won"][:-1]) for r in rows])), 3),
           "actor_won": int(sum(r["won"][-1] for r in rows)), "per_state": rows,
           "wall_s": round(time.time() - t0, 1)}  # fmt: skip
    report(out, args.out)


if __name__ == "__main__":
    main()
