"""RLlib ConnectorV2 pieces of cloudrl (env-to-module and module-to-env pipelines).

* :mod:`.stacked_batch`: the env runner's sampling path for one single-agent, stateless
  module on a vectorized env: observations stacked per key in one call, actions handed
  back as batched numpy arrays (replaces RLlib's default per-item pipelines).
"""
