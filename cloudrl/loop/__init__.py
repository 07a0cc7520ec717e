"""The production loop: model registry, retraining from operator feedback, canary rollout,
backup and restore (``cloudrl loop ...``, ``cloudrl backup``, ``cloudrl restore``)."""
