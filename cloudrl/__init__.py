"""cloudrl: RL for cloud cluster scheduling.

Importing it imports ``envs``, which registers the cluster envs' gymnasium ids and
their RLlib env names (``envs.registration``).
"""

import envs  # noqa: F401  (registers the env ids)
