"""cloudrl: RL for cloud cluster scheduling."""
