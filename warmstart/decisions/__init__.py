"""Pure, Pulumi-free decisions: instance facts, loader tuning, sizing, naming."""
