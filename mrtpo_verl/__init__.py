"""mrtpo-verl: Multi-Reward-to-Token Policy Optimization as a verl plugin."""

__version__ = "0.1.0"
