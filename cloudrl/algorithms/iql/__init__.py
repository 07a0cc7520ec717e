"""Implicit Q-learning (Kostrikov, Nair & Levine 2021) on logged transitions: expectile
value learning, a twin Q on the joint discrete action, and advantage-weighted extraction
into a branching policy module."""

from cloudrl.algorithms.iql.config import IQLConfig
from cloudrl.algorithms.iql.learner import Transitions, train_iql

__all__ = ["IQLConfig", "Transitions", "train_iql"]
