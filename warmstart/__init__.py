"""warmstart: one Pulumi stack for vLLM on Amazon EKS with fast cold starts."""
