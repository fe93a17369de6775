"""warmstart's planners (pure; no Pulumi): from a config, every decision, or every broken rule.

- `stack`: a whole environment stack (`plan_stack`), every layer's rules reported at once;
- `aws`: network, buckets and roles; `cluster`: the cluster, its system node group and GPU pools;
- `model`: one model on one instance type (`plan_model`), what its components build from;
- `platform`: the platform a model runs on (`PlatformArgs` facts) and a model planned on it.

This package's own module imports nothing, so a builder that needs only a plan's record type
does not load the planners.
"""
