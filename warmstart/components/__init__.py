"""Pulumi components: each translates decisions (warmstart.plan) into resources."""
