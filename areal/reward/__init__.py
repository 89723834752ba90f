"""Rewards of the AReaL import paths: ``areal.reward.gsm8k.gsm8k_reward_fn`` over ``math_verify``."""
