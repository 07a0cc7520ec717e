"""Preference alignment: demonstrations, preference-pair datasets, the safety-bound teacher,
behaviour cloning and the reward model.

Submodules are imported on demand (``from cloudrl.alignment.preferences import read_pairs``)
so that importing the package stays cheap.
"""
