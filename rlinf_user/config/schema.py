"""Typed configuration schemas. Hydra YAML under ``configs/`` fills these in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


@dataclass
class EdgeConfig:
    """Where the edge daemon that owns a real robot listens (see ``rlinf-user edge``)."""

    host: str = MISSING
    port: int = 5555
    # CURVE keys from `rlinf-user edge keygen`: the daemon's public key, this side's secret
    server_public_key: str | None = None
    client_secret_key: str | None = None
    timeout_s: float = 2.0  # no reply to a step within this: the episode is truncated
    heartbeat_s: float = 0.5
    hello_timeout_s: float = 10.0
    reconnect_s: float = 60.0  # keep retrying a lost daemon this long before failing
    # Action chunks (policies with a horizon > 1, off-policy learning): the whole chunk goes
    # to the daemon, which runs it at the control rate and streams every tick's observation
    # back; the next chunk is computed while the last `lookahead_s` of this one runs, so
    # the robot never waits for the model. blend: ticks over which a new chunk is blended
    # into the old one. false: one `act` per step (the robot pauses while the model runs).
    stream_chunks: bool = True
    lookahead_s: float = 0.3
    blend: int = 2
    # Rehearse a long link: reach the daemon through an emulated one (each direction:
    # {delay_ms, jitter_ms, mbit, queue_bytes}), e.g. {delay_ms: 50, mbit: 20}. None: direct.
    link: Any = None


@dataclass
class EnvConfig:
    """One environment: a simulator task or a real robot behind the edge daemon."""

    kind: str = "sim"  # sim | robot
    backend: str = "maniskill"  # maniskill | gym_hil | robosuite | franka
    task: str = "PickCube-v1"
    max_episode_steps: int = 50
    cameras: list[str] = field(default_factory=list)  # empty: state-only observations
    image_size: int = 128  # every camera reaches the policy as image_size x image_size
    # per camera, a box [x, y, w, h] cut from the frame before the resize to image_size (pixels
    # of the frame as the env makes it: a simulator's render_size, a robot's served frame)
    crops: dict[str, Any] = field(default_factory=dict)
    render_size: int | None = None  # a simulator renders at this size (None: image_size)
    reward: str = "dense"  # dense | sparse (backends that support both)
    sim_device: str = "auto"  # auto | cpu | cuda (GPU-parallel where the backend has it)
    control_hz: float = 10.0
    # Reward added on a step that ends the episode in success. With a dense reward and
    # success terminating the episode, a learner otherwise prefers to hover just short of
    # success and keep collecting reward; ~ r_max / (1 - gamma) removes that incentive.
    success_bonus: float = 0.0
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to the backend
    # A language instruction (or a list: one is drawn per episode) every observation
    # carries; datasets record it as the episode's task. None: no instruction.
    instruction: Any = None
    edge: EdgeConfig | None = None


@dataclass
class RoleResources:
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)
    group: str | None = None  # a name in placement.groups: run on a node of that group


@dataclass
class RolloutRole(RoleResources):
    """The policy-inference role (``rlinf_user.runtime.serving.rollout_server``). Disabled: each
    env worker runs its own copy of the policy. Enabled: one server holds the policy on
    its device and answers every worker's steps in shared batches."""

    enabled: bool = False
    device: str = "auto"  # auto | cpu | cuda
    max_batch: int = 256  # rows (env observations) per forward pass
    max_wait_ms: float = 0.0  # hold a batch open this long for more requests (0: never wait)


@dataclass
class PlacementConfig:
    """Maps roles onto hardware.

    ``collocated``: the replay buffer lives inside the learner process and the learner
    and rollout share the device(s). ``disaggregated``: every role is its own Ray actor
    with its own resources (the buffer too), so roles can sit on different devices/nodes.
    """

    mode: str = "collocated"  # collocated | disaggregated | auto (chosen from a profile at start)
    profile_s: float = 30.0  # placement=auto: the profile's time budget (seconds)
    ray_address: str | None = None  # None: start a local Ray runtime
    # Named node groups: a node belongs to a group by offering its custom resource
    # (`ray start --resources='{"gpu_box": 1}'`); a role with `group: gpu_box` lands there.
    groups: dict[str, Any] = field(default_factory=dict)
    num_env_workers: int = 1
    # elastic: above num_env_workers, env workers are added while the cluster has free CPUs
    # for them (a node joined), up to this many; one whose node leaves is retired. 0: fixed
    max_env_workers: int = 0
    envs_per_worker: int = 1
    learner: RoleResources = field(default_factory=RoleResources)
    env_worker: RoleResources = field(default_factory=RoleResources)
    buffer: RoleResources = field(default_factory=lambda: RoleResources(num_cpus=0.5))
    eval_worker: RoleResources = field(default_factory=RoleResources)  # simulators: where evaluation runs
    rollout: RolloutRole = field(default_factory=RolloutRole)
    reward: RoleResources = field(default_factory=lambda: RoleResources(num_cpus=0.5))  # with reward.classifier
    learner_device: str = "auto"  # auto | cpu | cuda
    learner_replicas: int = 1  # > 1: data-parallel learner, each replica a 1/N shard of every batch (gloo/NCCL)
    # Weight sync: a worker more than this many versions behind waits for the newest
    # (None: never waits); publish only the tensors that changed (a frozen backbone once).
    max_policy_lag: int | None = None
    publish_changed_only: bool = True
    # How the bytes move: tcp (the learner serves them on `weight_port`, 0 = any free
    # port; workers pull directly) or ray (through Ray's object store, Ray's ports only).
    weight_transport: str = "tcp"
    weight_port: int = 0
    # tcp: workers pull through an emulated link ({delay_ms, jitter_ms, mbit}; tests, rehearsals)
    weight_link: Any = None
    torch_threads: int = 1  # intra-op threads of every role's process
    learner_threads: int | None = None  # the learner's (None: torch_threads)


@dataclass
class FleetMember:
    """One robot (behind its edge daemon) or simulator instance feeding the learner.

    ``env`` overrides the run's ``env`` for this member (another edge host, task, camera
    set...); ``resources`` pin its workers to the node that reaches it, e.g.
    ``{"franka_left": 1}`` offered by that robot PC. Members may differ in state size,
    cameras and active action dims: the learner trains one policy on their union."""

    name: str = MISSING
    env: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, float] = field(default_factory=dict)
    workers: int = 1
    envs_per_worker: int = 1
    num_cpus: float = 1.0


@dataclass
class BufferConfig:
    capacity: int = 1_000_000
    persist: bool = True  # append every transition chunk to disk as it arrives
    chunk_steps: int = 50  # env steps an env worker batches before sending
    # The log keeps what a restart needs (`capacity` transitions; older segments are
    # deleted, so disk stays bounded) unless keep_full_log=true (every transition ever).
    keep_full_log: bool = False
    segment_mb: float = 256.0


@dataclass
class TeleopConfig:
    """A teleop device (``configs/teleop/``); fields a device does not use are ignored."""

    device: str = "spacemouse"  # spacemouse | keyboard | gamepad | synthetic (a scripted expert, sims)
    path: Any = None  # device node / hidraw path; None: the first one found
    replay: str | None = None  # play a recorded device session instead of a live device
    controls: str | None = None  # a second device for episode controls (e.g. keyboard)
    rate_hz: float = 10.0  # teleop loop rate = dataset fps
    # simulators: choose the episodes' reset seeds so the object's positions cover the
    # workspace evenly (rlinf_user/teleop/spread.py) instead of N random draws
    spread: bool = False
    translation_map: list[str] = field(default_factory=lambda: ["-y", "-x", "-z"])
    rotation_map: list[str] = field(default_factory=lambda: ["-y", "-x", "-z"])
    full_scale: float = 350.0
    deadzone: float = 0.08
    translation_gain: float = 1.0
    rotation_gain: float = 1.0
    buttons: Any = None
    speed: float = 0.6
    stick_range: list[int] = field(default_factory=lambda: [-32768, 32767])
    trigger_range: list[int] = field(default_factory=lambda: [0, 1023])


@dataclass
class DatasetConfig:
    """Where ``rlinf-user teleop`` / ``hg-dagger`` write episodes (LeRobotDataset v3.0)."""

    root: str | None = None  # required by teleop: dataset.root=demos/pick
    resume: bool = False  # append to an existing dataset
    task: str | None = None  # the episodes' task text; default: the env task name
    episodes: int = 50
    crf: int = 18  # h264 quality (lower: better, bigger)


@dataclass
class HGDaggerConfig:
    """``rlinf-user hg-dagger``: rounds of policy-acts/human-corrects episodes."""

    rounds: int = 5
    episodes_per_round: int = 10
    eval_episodes: int = 0  # hands-off episodes before round 1 (demos only) and after each round
    ramp_steps: int = 3  # hand-over/hand-back blend length (steps)
    warmup_updates: int = 500  # BC updates on the demonstrations before the robot moves
    lr: float = 1e-3
    batch_size: int = 256
    updates_per_s: float = 300.0  # learner rate cap (keeps a core for the control side)
    publish_every: int = 50  # updates between published policy versions
    # 0: the learner trains in the background while the robot moves (a person's session:
    # training never makes them wait). N > 0: after each corrected episode the learner
    # trains exactly N updates and publishes while the robot waits, so a session learns
    # the same on any machine (benchmarks, tests); updates_per_s is then unused
    updates_per_episode: int = 0
    # a scripted supervisor on a simulated SpaceMouse instead of a person (gym_hil pick)
    synthetic_human: bool = False
    synthetic_demos: int = 2  # demonstrations the synthetic human records first (when no demos=)


@dataclass
class InterventionConfig:
    """A person supervising ``rlinf-user train`` with a teleop device (HIL-SERL style):
    they take over env worker 0 through the ``teleop`` device's deadman/toggle; every
    step they control is flagged and, with ``to_demos``, also sampled as a demonstration."""

    enabled: bool = False
    ramp_steps: int = 3  # hand-over/hand-back blend length (steps)
    to_demos: bool = True  # intervention steps also feed the demo side of each batch
    # a scripted supervisor on a simulated SpaceMouse instead of a person (gym_hil pick)
    synthetic_human: bool = False
    # the scripted supervisor's temper: it takes over after `patience` steps in a row
    # without progress and keeps control `min_control` steps before handing back
    patience: int = 5
    min_control: int = 8


@dataclass
class RewardConfig:
    """A learned reward (``rlinf_user.runtime.serving.reward_server``): a success classifier from
    ``rlinf-user train-reward`` scores every step; ``success_reward`` where it says
    success, 0 elsewhere, replaces the env's reward. None: the env's own reward."""

    classifier: str | None = None
    threshold: float | None = None  # None: the one stored with the classifier
    success_reward: float = 1.0
    # true: a step classified a success ends the episode (terminated, env reset), as in
    # HIL-SERL. Off by default: a classifier that fires before the real success (it did,
    # in the README's learned-reward results) then cuts every episode short of it
    ends_episode: bool = False


@dataclass
class CalibrationConfig:
    """``rlinf-user calibrate`` (see :mod:`rlinf_user.calibration`): results go to
    ``<root>/<robot>/<name>.yaml``; boards are ChArUco (``squares_x, squares_y, square_m,
    marker_m, dictionary``)."""

    root: str = "calibration"
    camera: str | None = None  # the edge daemon's camera to calibrate
    name: str | None = None  # result file name (default: the camera's, or "workspace")
    mode: str = "eye_in_hand"  # eye_in_hand (camera on the arm) | eye_to_hand (fixed camera, board on the arm)
    intrinsics: str = "driver"  # driver (the camera's own; else the board fit) | charuco (always fit)
    board: dict[str, Any] = field(default_factory=lambda: {"squares_x": 7, "squares_y": 5, "square_m": 0.04,
                                                            "marker_m": 0.03, "dictionary": "DICT_4X4_50"})  # fmt: skip
    views: int = 12  # poses to visit
    min_views: int = 6  # with the board found; fewer refuses the calibration
    tilt_deg: float = 20.0  # the pose set's tilts (about the tool's x and y) ...
    spin_deg: float = 30.0  # ... and turns about the tool axis
    shift_m: float = 0.03
    pivot_m: float = 0.45  # turn about a point this far along the tool axis (eye-in-hand: the board)
    center_offset: list[float] = field(default_factory=lambda: [0.1, 0.0, -0.05])  # from home, base frame
    max_residual_mm: float = 5.0  # a worse result is reported and not saved
    max_residual_deg: float = 1.0
    corners: int = 4  # workspace: corner poses the person records (>= 2: their bounding box)
    margin_m: float = 0.0  # workspace: grow (+) or shrink (-) the recorded box
    workspace: str | None = None  # check: the workspace calibration drawn (a name or a .yaml path)
    crops: Any = None  # check: {camera: [x, y, w, h]} drawn on the frame (None: env.crops, what training cuts)
    out: str | None = None  # check: the picture's path (default <root>/<robot>/check-<camera>.png)


@dataclass
class RunConfig:
    env: EnvConfig = field(default_factory=EnvConfig)
    algo: Any = None  # the typed config of the algorithm algo=<name> picks (its module's `config`)
    # an env's tuning per algorithm family ({sac: {gamma: 0.9}, ppo: {...}}), set by sim/ and
    # robot/ configs and applied to `algo` unless the command line sets the same key
    algo_tuning: dict[str, Any] = field(default_factory=dict)
    # the env's policy (name and fields) unless the command line picks one (policy=...);
    # a policy.<key>=... on the command line still wins
    policy_defaults: dict[str, Any] = field(default_factory=dict)
    policy: Any = None  # the typed config of the policy policy=<name> picks (its class's `config`)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    teleop: TeleopConfig = field(default_factory=TeleopConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    hg_dagger: HGDaggerConfig = field(default_factory=HGDaggerConfig)
    intervention: InterventionConfig = field(default_factory=InterventionConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    # Several robots/sims feeding one learner; empty: `env` on placement.num_env_workers.
    fleet: list[FleetMember] = field(default_factory=list)
    # Append a one-hot member id to the state (None: when the members' envs differ).
    fleet_member_id: bool | None = None
    seed: int = 0
    total_env_steps: int = 100_000
    target_success: float | None = None  # stop early once evaluation reaches it
    eval_every_steps: int = 5_000
    eval_episodes: int = 20  # per evaluation during training, on the validation seeds (best.pt is chosen on them)
    # evaluation episodes run side by side on this many sim envs, one batched policy call
    # per step for all of them (a VLA's or a chunk policy's evaluation is bound by its
    # calls); the same episodes and seeds whatever the number. A robot is one env.
    eval_envs: int = 1
    # the kept policy (best.pt, else the last) at the end, on the test seeds nothing selects
    # on (None: eval_episodes; 0: none). A robot's reset is physical, so only sims run it.
    test_episodes: int | None = None
    eval_at_start: bool = False  # evaluate the starting policy too (a checkpoint's success before fine-tuning)
    checkpoint_every_steps: int = 10_000
    keep_checkpoints: int = 3  # the newest N learner checkpoints stay (plus best.pt); 0: all
    publish_every_updates: int = 50
    run_root: str = "runs"
    run_name: str | None = None
    resume: str | None = None
    demos: str | None = None
    max_wall_minutes: float | None = None
    progress: bool = True
