"""``policy=pi0`` behind the policy interface: contract observations in (cameras of any
size, state, instruction), a chunk of H actions out; tokenizer folders; checkpoints with
their norm statistics; refusals that name what is wrong."""

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from rlinf_user.config.compose import compose_config  # noqa: E402
from rlinf_user.env.spec import EnvSpec, obs_to_torch  # noqa: E402
from rlinf_user.policies.base import build_policy  # noqa: E402
from rlinf_user.policies.pi0 import Pi0Policy, resize_with_pad  # noqa: E402
from rlinf_user.policies.pi0_checkpoint import NormStats, save_openpi  # noqa: E402
from rlinf_user.policies.vla_text import PromptTokenizer, open_tokenizer  # noqa: E402

SPEC = EnvSpec(state_dim=10, cameras={"front": (48, 64), "wrist": (32, 32)}, instruction=True)  # 7 action dims


def obs(b=2, seed=0, instruction=("pick up the cube", "push the cube")):
    rng = np.random.default_rng(seed)
    o = {
        "state": rng.normal(size=(b, 10)).astype(np.float32),
        "images": {"front": rng.integers(0, 255, (b, 48, 64, 3), dtype=np.uint8),
                   "wrist": rng.integers(0, 255, (b, 32, 32, 3), dtype=np.uint8)},  # fmt: skip
        "instruction": np.array(list(instruction)[:b]),
    }
    return obs_to_torch(o)


def policy(*extra):
    torch.manual_seed(0)
    return build_policy(compose_config(["policy=pi0", *extra]).policy, SPEC).eval()


def test_acts_in_chunks_on_contract_observations():
    p = policy()
    assert isinstance(p, Pi0Policy) and p.horizon == 4 and p.cameras == ["front", "wrist"]
    out = p.act(obs())
    assert out.actions.shape == (2, 4, 7) and out.actions.abs().max() <= 1.0
    assert out.extras["sample"].shape == (2, 3 + 1, 4, 32)  # the Flow-Noise chain: K + 1 steps
    assert out.extras["log_prob"].shape == (2, 4 * 7) and out.extras["value"].shape == (2,)
    torch.testing.assert_close(out.actions, p.env_actions(out.extras["sample"][:, -1]))
    # deterministic: the flow from zero noise, the same chunk every time
    torch.testing.assert_close(p.act(obs(), deterministic=True).actions, p.act(obs(), deterministic=True).actions)
    # the instruction conditions the actions
    a = p.act(obs(instruction=("pick up the cube", "pick up the cube")), deterministic=True).actions
    assert not torch.allclose(a[0], p.act(obs(instruction=("stack the blocks", "x")), deterministic=True).actions[0])
    assert policy("policy.horizon=6", "policy.num_steps=2").act(obs()).actions.shape == (2, 6, 7)


def test_images_keep_their_aspect_and_missing_cameras_are_masked():
    img = torch.full((1, 20, 40, 3), 255, dtype=torch.uint8)
    x = resize_with_pad(img, 32)
    assert x.shape == (1, 3, 32, 32)
    assert torch.all(x[:, :, 8:24] > 0.99) and torch.all(x[:, :, :8] == -1) and torch.all(x[:, :, 24:] == -1)
    p = policy("policy.cameras=[wrist]")
    images, masks, *_ = p.model_inputs(obs())
    assert masks[0].tolist() == [True, True] and masks[1] is None and images[1] is None
    # the missing camera's slot is left out of the prefix: one camera's tokens, then the instruction's
    emb, pad = p.model.embed_prefix(images, masks, *p.model_inputs(obs())[2:4])
    assert emb.shape[1] == p.model.embed_prefix(images[:1], masks[:1], *p.model_inputs(obs())[2:4])[0].shape[1]
    with pytest.raises(ValueError, match=r"policy.cameras=\['side'\]"):
        policy("policy.cameras=[side]")


def test_an_instruction_over_the_token_budget_is_refused_not_cut():
    p = policy()
    with pytest.raises(ValueError, match="is 69 tokens; the model takes at most 48"):
        p.act(obs(instruction=("pick up the red cube and put it in the bowl next to the green plate", "x")))


def test_a_tokenizer_folder_loads_offline_and_a_missing_one_says_what_to_put_there(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<bos>", "<unk>", "pick", "up", "the", "cube", "\n"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                            unk_token="<unk>").save_pretrained(tmp_path / "tok")  # fmt: skip
    prompt = PromptTokenizer(open_tokenizer(tmp_path / "tok"), 8)
    ids, mask = prompt(["pick up the cube", "pick"])
    assert ids[0, :4].tolist() == [2, 4, 5, 6] and mask[0].all() and mask[0].sum() >= 5  # the longest sets the width
    assert mask[1].sum() < mask[0].sum() and not mask[1, -1] and ids.shape[1] <= 8  # shorter ones are padded
    p = policy(f"policy.tokenizer={tmp_path / 'tok'}")
    assert p.act(obs()).actions.shape == (2, 4, 7)
    with pytest.raises(FileNotFoundError, match="tokenizer.json or tokenizer.model"):
        open_tokenizer(tmp_path / "absent")


def test_a_checkpoint_brings_its_norm_statistics(tmp_path):
    p = policy()
    dim = 32
    stats = {"state": NormStats(np.full(dim, 2.0, np.float32), np.full(dim, 4.0, np.float32)),
             "actions": NormStats(np.full(dim, 0.1, np.float32), np.full(dim, 0.2, np.float32))}  # fmt: skip
    folder = save_openpi(p.model, tmp_path / "ckpt", stats)
    q = policy(f"policy.checkpoint={folder}")
    _, _, _, _, state = q.model_inputs(obs())
    torch.testing.assert_close(state[:, :10], (obs()["state"] - 2.0) / (4.0 + 1e-6))
    assert state[:, 10:].eq(0).all()
    # the same weights; the chunk is the model's output un-normalised by the action stats
    assert all(torch.equal(v, q.model.state_dict()[k]) for k, v in p.model.state_dict().items())
    out, _ = q.model.sample_actions(*q.model_inputs(obs()), noise=torch.zeros(2, 4, 32))
    expected = (out[..., :7] * (0.2 + 1e-6) + 0.1).clamp(-1, 1)
    torch.testing.assert_close(q.act(obs(), deterministic=True).actions, expected)
    narrow = {k: NormStats(v.mean[:5], v.std[:5]) for k, v in stats.items()}
    save_openpi(p.model, tmp_path / "narrow", narrow)
    with pytest.raises(ValueError, match="norm_stats.state.mean has 5 dims; the env needs 10"):
        policy(f"policy.checkpoint={tmp_path / 'narrow'}")


def test_a_compiled_denoising_step_acts_as_the_eager_one():
    """``policy.compile``: the denoising step is captured whole (``fullgraph``: nothing in it
    breaks the graph, so inductor and CUDA graphs can take it on a GPU); acting with it gives
    the eager chunk, the Flow-Noise chain scores the same, and passes with gradients (the
    learner's) stay eager. Here the ``aot_eager`` backend: the capture, without C++ compile
    time."""
    eager, compiled = policy(), policy("policy.compile=aot_eager")
    assert compiled.model._compiled_velocity is not None
    o = obs()
    torch.testing.assert_close(compiled.act(o, deterministic=True).actions, eager.act(o, deterministic=True).actions)
    torch.manual_seed(1)
    out = compiled.act(o)
    logp, _ = eager.log_prob(o, out.extras["sample"])
    torch.testing.assert_close(logp, out.extras["log_prob"], rtol=1e-4, atol=1e-4)
    logp, _ = compiled.log_prob(o, out.extras["sample"])  # with gradients: the eager step
    logp.sum().backward()
    assert any(p.grad is not None for p in compiled.model.parameters())
    with pytest.raises(ValueError, match=r"policy.compile='fast': an inductor mode \(default, reduce-overhead"):
        policy("policy.compile=fast")


def test_a_fresh_model_reads_a_state_wider_than_pi0s():
    """pi0 checkpoints read 32 state dims; a model built fresh (``policy.size``) widens its
    state projection to the env's (ManiSkill's state-only PushCube has 35)."""
    spec = EnvSpec(state_dim=35)
    p = build_policy(compose_config(["policy=pi0"]).policy, spec).eval()
    assert p.model.cfg.state_dim == 35
    o = obs_to_torch({"state": np.zeros((2, 35), np.float32), "images": {}})
    assert p.act(o).actions.shape == (2, 4, 7)


def test_a_bfloat16_policy_acts_on_float32_observations_deterministically_and_for_rl():
    """Serving in bfloat16 (as on a GPU): the float32 state, noise and features reach
    bfloat16 projections, and the chunk comes back in the env's float range."""
    p = policy().to(dtype=torch.bfloat16)
    ref = policy()
    out = p.act(obs(), deterministic=True)
    want = ref.act(obs(), deterministic=True).actions
    assert out.actions.shape == want.shape and torch.isfinite(out.actions.float()).all()
    assert (out.actions.float() - want).abs().max() < 0.1  # the same function, at bfloat16's precision
    rl = p.act(obs(), deterministic=False)
    assert torch.isfinite(rl.extras["log_prob"].float()).all() and rl.extras["value"].dtype == torch.float32
