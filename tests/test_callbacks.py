"""Training-time cluster metrics: episode totals over RLlib episode chunks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from cloudrl.callbacks import _SUMMED, episode_totals


def _info(t: int) -> dict[str, float]:
    return {key: float(t + 1) for key in _SUMMED}


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(1, 6), min_size=1, max_size=5),
       lookback=st.integers(0, 2))
def test_totals_count_every_step_once_across_chunk_cuts(lengths: list[int],
                                                         lookback: int) -> None:
    episode = SingleAgentEpisode()
    episode.add_env_reset(observation=0, infos={})
    chunks, t = [], 0
    for i, length in enumerate(lengths):
        if i:
            chunks.append(episode)
            episode = episode.cut(len_lookback_buffer=min(lookback, t))
        for _ in range(length):
            episode.add_env_step(observation=t + 1, action=0, reward=0.0, infos=_info(t))
            t += 1
    chunks.append(episode)
    totals = episode_totals(chunks)
    # steps 0..t-1 each carry t+1 in every key: the sum is t(t+1)/2, once per step
    assert totals == pytest.approx(dict.fromkeys(_SUMMED, t * (t + 1) / 2))
