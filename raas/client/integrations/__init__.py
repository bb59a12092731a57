"""Adapters from raas to trainers' rollout interfaces."""
