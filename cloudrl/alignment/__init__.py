"""Preference alignment: the safety-bound teacher, behaviour cloning, the reward model and
RL fine-tuning on the learned reward (the formats they read and write, demonstrations and
preference pairs, live in :mod:`cloudrl.data`).

Submodules are imported on demand (``from cloudrl.alignment.teacher import Teacher``)
so that importing the package stays cheap.
"""
