"""RLModules: encoders, masked PPO/DQN, BDQ."""
