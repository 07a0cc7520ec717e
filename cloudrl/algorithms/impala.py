"""IMPALA (RLlib's, with the masked PPO module): typed hyperparameters, iteration hook.

One train batch is two sample() calls of one runner at RLlib's rollout fragment of
50 steps x 8 vectorized envs; each batch is used once (no epochs, no minibatches).
With remote env runners the driver waits up to 0.1 s for their samples instead of
polling in a busy loop (RLlib's 0 s): on a small machine the loop took the CPU the
runners sample with (APPO, 1 runner, 2 cores: 2-3.3x the env steps/s with the wait;
``experiments/benchmarks/bench_appo.py``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from cloudrl.algorithms.hparams import Hparams


class IMPALAHparams(Hparams):
    """``IMPALAConfig.training(...)`` (V-trace actor-critic): PPO's lr, discount and loss
    weights."""

    lr: float = Field(default=3e-4, gt=0)
    gamma: float = Field(default=0.99, ge=0, le=1)
    train_batch_size_per_learner: int = Field(default=800, ge=1)
    entropy_coeff: float = Field(default=0.01, ge=0)
    vf_loss_coeff: float = Field(default=0.5, ge=0)
    grad_clip: float | None = Field(default=1.0, gt=0, description="None: no clipping")
    vtrace_clip_rho_threshold: float = Field(default=1.0, gt=0)
    vtrace_clip_pg_rho_threshold: float = Field(default=1.0, gt=0)
    timeout_s_sampler_manager: float = Field(default=0.1, ge=0)
    broadcast_interval: int | None = Field(default=None, ge=1)


def iterations_per_train_batch(config: Any) -> None:
    """APPO/IMPALA: an iteration is one train batch of env steps, as for PPO.

    RLlib's IMPALA family defaults to iterations of at least 10 s, however few steps
    that is; cloudrl logs and checkpoints per iteration, so iterations follow the
    batch size instead. Sampling works in the driver (``num_env_runners=0``, then
    sampling and learning alternate) and on remote env runners (sampling overlaps
    learning: the asynchronous actor-learner split these algorithms are made for).
    """
    config.reporting(min_time_s_per_iteration=0,
                     min_sample_timesteps_per_iteration=config.total_train_batch_size)
