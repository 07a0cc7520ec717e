"""RLlib env runners (``config.env_runners(env_runner_cls=...)``)."""
